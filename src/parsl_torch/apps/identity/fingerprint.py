"""Stable fingerprints of a stage's function and arguments: the same in every
process, under any ``PYTHONHASHSEED``, on any node.

Pickle bytes are not that (dill writes a function's globals in an order that
depends on the hash seed, and pickles importable functions by name, without
their body), so a value is turned into a canonical token instead:

* plain data (numbers, strings, bytes, lists, tuples, dicts, sets, frozensets,
  OrderedDicts, dataclasses, enums, ``Path``, numpy arrays and torch tensors)
  by value; dicts and sets do not depend on order, OrderedDicts do; a
  library's mapping or sequence (OmegaConf's ``DictConfig`` and ``ListConfig``,
  a ``UserDict``) by its items, as a dict or a list; an ``argparse.Namespace``
  (``parse_args()``'s) or a ``SimpleNamespace`` by its attributes;
* a ``Path`` or File by its path, kept in ``files`` (a file the stage is told
  about: its content joins the call's identity where the call is launched);
  a string is a string (the files a stage reads, named however, are observed:
  ``identity.reads``);
* a function or class of the workflow script by its code: the bytecode and
  constants of every code object inside it (no line numbers, no file name:
  a comment or a blank line changes nothing), its defaults and closure, and
  the value of each global it uses, recursively; a user module it imports
  inside its body (``import x``, ``importlib.import_module("x")``) joins the
  code roots;
* a function, class or module of a user module (``usercode``) by name, and
  the module's file is added to the stage's code roots (its digest covers it);
  but the file does not say what the workflow set at run time
  (``config.SCALE = int(sys.argv[1])``): the current values of the user
  modules' names that the code reads (``config.SCALE`` in the stage, a global
  that a user module's function reads, recursively) are part of the token
  (``state``), compared as arguments are; a value that is not plain data (a
  model, a connection) is not compared, and its type says so in the token;
  anything from an installed package by name, the package kept in ``packages``
  (its version and files join the identity: ``identity.packages``).

An argument that has no such token is an error naming it (``Unidentifiable``);
a global of the workflow script that has none is fingerprinted by its dill
bytes (which may make a stage rerun needlessly, never skip wrongly).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import functools
import os
import sys
import types
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any

from ..stage.options import closure_values
from .digests import sha
from .bytecode import attributes_read, code_without_positions, global_names, imported_names
from .usercode import is_user_file, user_files


class Unidentifiable(TypeError):
    """A value with no stable identity: ``where`` names it (``argument 'cfg' -> key 'lock'``)."""

    def __init__(self, where: str, value: Any) -> None:
        self.where, self.type_name = where, f"{type(value).__module__}.{type(value).__qualname__}"
        super().__init__(f"{where} is a {self.type_name}, which has no stable identity for reruns: pass plain "
                         f"data (numbers, strings, lists, dicts, dataclasses, arrays), a Path, or write it to a "
                         f"file and pass that as an input File")


_MAIN = "__main__"
#: strings longer than this are compared by digest
LONG_STR = 4096
#: objects that are their attributes: ``train(parser.parse_args())``
NAMESPACES = (argparse.Namespace, types.SimpleNamespace)
#: a library's mapping or sequence with more items than this is hashed whole (as other objects)
MAX_CONTAINER = 100_000


class Fingerprinter:
    """Tokens for one stage call; ``roots`` collects the user modules they reach."""

    def __init__(self, strict: bool, state_apart: bool = False) -> None:
        self.strict = strict
        #: what user modules hold that the code reads (``config.SCALE`` -> its value's digest), kept apart from
        #: the code's token where ``state_apart`` (a stage's function: "config.SCALE changed", not "code")
        self.state: dict[str, str] = {}
        self._state_apart = state_apart
        #: (file, module name) of each user module the tokens reached
        self.roots: set[tuple[str, str]] = set()
        #: the files and directories that Path and File values name (absolute paths)
        self.files: set[str] = set()
        #: top-level names of the installed modules the tokens reached (``identity.packages``)
        self.packages: set[str] = set()
        self._active: set[int] = set()
        self._states: dict[int, list] = {}  # a user module's function -> what it reads (once per call)

    def digest(self, value: Any, where: str) -> str:
        """``value``'s token as a digest (the files it names are in ``files``, compared where it runs)."""
        return sha(repr(self.token(value, where)).encode())

    # -- values --------------------------------------------------------------------------------------------
    def token(self, value: Any, where: str) -> Any:
        """``value`` as plain data that equals itself across processes: plain values as they are, containers by
        their items, the rest below."""
        kind = type(value)
        if kind is str:  # a long one by digest: repr() of a large value would copy it several times
            return ("str", value) if len(value) <= LONG_STR else \
                ("str", len(value), sha(value.encode(errors="surrogatepass")))
        if kind in (bytes, bytearray):
            return (kind.__name__, len(value), sha(value))
        if value is None or kind in (bool, int, float, complex):
            return (kind.__name__, repr(value))
        if isinstance(value, (list, tuple)):  # namedtuples too (their type is part of the value)
            return (self._type_name(kind), [self.token(v, f"{where}[{i}]") for i, v in enumerate(value)])
        if kind in (set, frozenset):
            return (kind.__name__, sorted(repr(self.token(v, f"{where} (an element)")) for v in value))
        if isinstance(value, dict):
            items = [(repr(("str", k) if type(k) is str else self.token(k, f"{where} (a key)")),  # a key names
                      self.token(v, f"{where}[{k!r}]")) for k, v in value.items()]           # (is no path)
            ordered = isinstance(value, OrderedDict)
            return (self._type_name(kind), items if ordered else sorted(items, key=lambda kv: kv[0]))
        return self._file_token(value) or self._object_token(value, where)

    def _file_token(self, value: Any) -> Any:
        """A path or a File: named, its file compared where the stage runs (``files``); else None."""
        if isinstance(value, PurePath):
            path = os.path.abspath(value)
            self.files.add(path)
            return ("path", path)
        if hasattr(value, "filepath") and hasattr(value, "url"):  # a Parsl File or a StageFile
            self.files.add(os.path.abspath(value.filepath))
            return ("file", str(value.url))
        return None

    def _object_token(self, value: Any, where: str) -> Any:
        """Any other value: code by its fingerprint, an object by what it holds, else by its bytes (or refused)."""
        kind = type(value)
        if isinstance(value, enum.Enum):
            return ("enum", self.token(kind, where), value.name)
        if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType,
                              types.MethodType, functools.partial)):
            return self._code_token(value, where)
        wrapped = getattr(value, "__wrapped__", None)  # a stage (DistributedApp), a functools.wraps decorator
        if wrapped is not None and not isinstance(value, type):
            return ("wrapped", self._type_name(kind), self.token(wrapped, where))
        if dataclasses.is_dataclass(value):
            return ("dataclass", self.token(kind, where),
                    [(f.name, self.token(getattr(value, f.name), f"{where}.{f.name}"))
                     for f in dataclasses.fields(value)])
        array = _array_token(value)
        if array is not None:
            return array
        if self._is_users(kind) and hasattr(value, "__dict__") or isinstance(value, NAMESPACES):
            # an instance of the user's own class, or parse_args()'s Namespace: by its attributes
            return ("object", self.token(kind, where), self.token(dict(vars(value)), where))
        return self._container(value, where) or self._opaque(value, where)

    def _container(self, value: Any, where: str) -> Any:
        """A library's mapping or sequence (OmegaConf's DictConfig and ListConfig, a UserDict) by its items, as
        a dict's or a list's: the paths in a Hydra config are inputs, and its identity is its content."""
        try:
            if isinstance(value, Mapping) and len(value) <= MAX_CONTAINER:
                return (self._type_name(type(value)), self.token(dict(value.items()), where)[1])
            if isinstance(value, Sequence) and not isinstance(value, (str, bytes, memoryview)) \
                    and len(value) <= MAX_CONTAINER:
                return (self._type_name(type(value)), [self.token(v, f"{where}[{i}]") for i, v in enumerate(value)])
        except Unidentifiable:
            raise  # (an item without an identity is named as such)
        except Exception:  # noqa: BLE001 - one that cannot be read so is hashed whole
            pass
        return None

    def _opaque(self, value: Any, where: str) -> Any:
        if self.strict:
            raise Unidentifiable(where, value)
        import dill

        try:
            return ("dill", self._type_name(type(value)), sha(dill.dumps(value, recurse=True)))
        except Exception:  # noqa: BLE001 - it cannot travel either: dill says why when the stage is shipped
            return ("unpicklable", self._type_name(type(value)))

    # -- code ----------------------------------------------------------------------------------------------
    def _is_users(self, obj: Any) -> bool:
        module = getattr(obj, "__module__", None)
        if module == _MAIN:
            return True
        mod = sys.modules.get(module or "")
        return bool(mod) and is_user_file(getattr(mod, "__file__", None))

    def _root(self, module_name: str | None) -> None:
        mod = sys.modules.get(module_name or "")
        file = getattr(mod, "__file__", None)
        if mod is not None and module_name != _MAIN and is_user_file(file):
            self.roots.add((os.path.realpath(file), module_name))
        elif module_name and module_name != _MAIN:
            self.packages.add(module_name.partition(".")[0])

    @staticmethod
    def _type_name(kind: type) -> str:
        return f"{kind.__module__}.{kind.__qualname__}"

    def _code_token(self, obj: Any, where: str) -> Any:
        if isinstance(obj, types.ModuleType):
            self._root(obj.__name__)
            return ("module", obj.__name__)
        if isinstance(obj, types.MethodType):
            return ("method", self.token(obj.__func__, where), self.token(obj.__self__, f"{where}.__self__"))
        if isinstance(obj, functools.partial):
            return ("partial", self.token(obj.func, where), self.token(obj.args, where),
                    self.token(obj.keywords, where))
        module = getattr(obj, "__module__", None)
        name = (module, getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj))))
        if module != _MAIN:
            self._root(module)  # a user module's digest covers its code; an installed one's version does
            if isinstance(obj, types.FunctionType) and self._is_users(obj) and id(obj) not in self._active:
                return ("named", *name, self._state(obj.__code__, obj.__globals__, obj.__qualname__, obj))
            return ("named", *name)
        if id(obj) in self._active:
            return ("recursive", *name)  # already being fingerprinted higher up
        self._active.add(id(obj))
        try:
            if isinstance(obj, types.FunctionType):
                return ("function", *name, self.function(obj))
            if isinstance(obj, type):
                members = [(k, self.token(v, f"{where}.{k}")) for k, v in vars(obj).items()
                           if not (k.startswith("__") and k.endswith("__")) or isinstance(v, types.FunctionType)]
                return ("class", *name, [self.token(b, where) for b in obj.__bases__], members)
            return ("named", *name)
        finally:
            self._active.discard(id(obj))

    def function(self, fn: types.FunctionType) -> str:
        """The digest of a function of the workflow script: its code, defaults, closure and globals."""
        code = fn.__code__
        used = sorted(global_names(code))
        globals_ = [(n, self.token(fn.__globals__[n], f"global {n!r} of {fn.__qualname__}"))
                    for n in used if n in fn.__globals__]
        globals_ += self._module_state(code, fn.__globals__, fn.__qualname__)
        cells = [self.token(value, f"a closure variable of {fn.__qualname__}") for value in closure_values(fn)]
        for name in imported_names(code):  # ``import helpers`` inside the function: helpers is code it runs
            found = user_files(name, sys.path)
            self.roots.update(found)
            if not found:
                self.packages.add(name.partition(".")[0])
        parts = (code_without_positions(code), self.token(fn.__defaults__, f"the defaults of {fn.__qualname__}"),
                 self.token(fn.__kwdefaults__, f"the defaults of {fn.__qualname__}"), cells, globals_)
        return sha(repr(parts).encode())

    # -- what user modules hold at run time ---------------------------------------------------------------
    def _state(self, code: types.CodeType, namespace: dict, where: str, owner: Any) -> list:
        """What a user module's function reads of its module's names and of other user modules, as the values
        are now (its module's file says only what they were when it ran)."""
        if id(owner) in self._states:
            return self._states[id(owner)]
        self._active.add(id(owner))
        try:
            module = namespace.get("__name__", "?")
            found = [self._read(f"{module}.{n}", namespace[n], f"global {n!r} of {where}")
                     for n in sorted(global_names(code)) if n in namespace
                     and not isinstance(namespace[n], types.ModuleType)]
            self._states[id(owner)] = found = found + self._module_state(code, namespace, where)
            return found
        finally:
            self._active.discard(id(owner))

    def _module_state(self, code: types.CodeType, namespace: dict, where: str) -> list:
        """``config.SCALE`` read in ``code``, ``config`` a user module: the value it holds now."""
        return [self._read(f"{module.__name__}.{attr}", getattr(module, attr), f"{name}.{attr} in {where}")
                for name, attr in sorted(attributes_read(code))
                if isinstance(module := namespace.get(name), types.ModuleType)
                and is_user_file(getattr(module, "__file__", None)) and hasattr(module, attr)]

    def _read(self, name: str, value: Any, where: str) -> Any:
        """A module's value ``name`` as the code reads it: plain data and the user's code by their tokens;
        anything else (a model, a lock, a connection) is not compared: its type stands for it. Apart: the
        token holds the name, ``state`` the value."""
        files = set(self.files)  # (a Path a module holds is a value: what the stage reads of it is observed)
        try:
            token = self.token(value, where) if _plain(value) else ("not compared", self._type_name(type(value)))
        except Unidentifiable:
            token = ("not compared", self._type_name(type(value)))
        self.files = files
        if not self._state_apart or isinstance(value, (types.FunctionType, type, functools.partial)):
            return (name, token)  # (code is the code's: its module's digest covers it, its token its state)
        self.state[name] = sha(repr(token).encode())
        return name


#: value types whose tokens a module's state is compared by (containers: by their items, each checked)
_PLAIN = (str, bytes, bytearray, bool, int, float, complex, type(None), PurePath, enum.Enum, types.FunctionType,
          type, functools.partial)


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is plain data (or code), all the way down: numbers, strings, paths, enums, the user's
    functions and classes, arrays, dataclasses, namespaces and the containers of these."""
    if isinstance(value, _PLAIN) or _is_array(value) or depth > 20:
        return depth <= 20
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return all(_plain(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value))
    if isinstance(value, NAMESPACES):
        return _plain(vars(value), depth + 1)
    return False


def _is_array(value: Any) -> bool:
    return type(value).__module__.partition(".")[0] in ("numpy", "torch") and hasattr(value, "dtype")


def _array_token(value: Any) -> Any:
    """numpy arrays and scalars, torch tensors: dtype, shape and the bytes' digest."""
    top = type(value).__module__.partition(".")[0]
    if top == "numpy" and hasattr(value, "tobytes") and hasattr(value, "dtype"):
        if value.dtype.hasobject:
            return None
        return ("ndarray", str(value.dtype), list(getattr(value, "shape", ())), sha(value.tobytes()))
    if top == "torch" and type(value).__name__ in ("Tensor", "Parameter"):
        import torch

        flat = value.detach().cpu().contiguous().reshape(-1)
        raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        return ("tensor", str(value.dtype), list(value.shape), sha(raw))
    return None
