"""What a code object says of the names it uses, read from its bytecode (``dis``): the globals it reads,
the attributes it reads from them, the modules it imports, and the code itself without its positions (a
comment or a blank line changes nothing). ``fingerprint`` builds a stage's identity on these."""

from __future__ import annotations

import dis
import types
from typing import Any

from .usercode import MODULE_IMPORTERS


def attributes_read(code: types.CodeType) -> set[tuple[str, str]]:
    """``(name, attribute)`` for each ``name.attribute`` a code object (or one nested in it) reads from a
    global: the attributes of modules it uses (``config.SCALE``, ``config.scaled(...)``)."""
    found: set[tuple[str, str]] = set()
    last = None
    for ins in dis.get_instructions(code):
        if ins.opname in _FILLER:
            continue
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and last is not None:
            found.add((last, ins.argval))
        last = ins.argval if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") else None
    return found.union(*(attributes_read(c) for c in code.co_consts if isinstance(c, types.CodeType)))


def imported_names(code: types.CodeType) -> set[str]:
    """The modules an ``import`` inside a code object (or one nested in it) can load: ``import a.b``
    -> a.b; ``from a import b`` -> a and a.b (b may be a module). Relative imports are left out: a
    workflow script's function is not in a package."""
    names: set[str] = set()
    consts: list[Any] = []
    for ins in dis.get_instructions(code):
        if ins.opname == "IMPORT_NAME" and len(consts) >= 2 and consts[-2] == 0:
            names.add(ins.argval)
            names.update(f"{ins.argval}.{item}" for item in consts[-1] or () if item != "*")
        consts = [*consts[-1:], ins.argval] if ins.opname == "LOAD_CONST" else []
    loads = _loads(code)  # ``importlib.import_module("x")`` with a literal, absolute name
    for i, (op, value) in enumerate(loads):
        if op == "const" and isinstance(value, str) and value and not value.startswith(".") and i \
                and loads[i - 1][0] == "name" and loads[i - 1][1] in MODULE_IMPORTERS:
            names.add(value)
    return names.union(*(imported_names(c) for c in code.co_consts if isinstance(c, types.CodeType)))


#: instructions that load nothing (they sit between a name and its argument in some Pythons)
_FILLER = {"CACHE", "PUSH_NULL", "PRECALL", "NOP", "EXTENDED_ARG", "RESUME", "COPY_FREE_VARS", "KW_NAMES"}


def _loads(code: types.CodeType) -> list[tuple[str, Any]]:
    """A code object's own instructions as ("const", value), ("name", name loaded) or ("op", opname)."""
    return [("const", ins.argval) if ins.opname.startswith("LOAD_CONST") else
            ("name", ins.argval) if ins.opname.startswith("LOAD_") else ("op", ins.opname)
            for ins in dis.get_instructions(code) if ins.opname not in _FILLER]


def code_without_positions(code: types.CodeType) -> tuple:
    """A code object without its positions (file, first line, line table)."""
    consts = tuple(const_token(c) for c in code.co_consts)
    return (code.co_name, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
            code.co_code.hex(), consts, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
            getattr(code, "co_exceptiontable", b"").hex())


_GLOBAL_OPS = {"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"}


def global_names(code: types.CodeType) -> set[str]:
    """The globals a code object reads or writes (not attribute names, which share ``co_names``)."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in _GLOBAL_OPS}
    return names.union(*(global_names(c) for c in code.co_consts if isinstance(c, types.CodeType)))


def const_token(value: Any) -> Any:
    if isinstance(value, types.CodeType):
        return code_without_positions(value)
    if isinstance(value, tuple):
        return ("tuple", [const_token(v) for v in value])
    if isinstance(value, frozenset):  # `x in {"a", "b"}`: its repr's order follows the hash seed
        return ("frozenset", sorted(repr(const_token(v)) for v in value))
    return (type(value).__name__, repr(value))
