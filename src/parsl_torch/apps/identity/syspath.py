"""The folders a module adds to the import path (``sys.path.append(os.path.join(HERE, "lib"))``), read
from its syntax tree without running it, so that the modules imported from them are user code too.

Research scripts often reach their own code this way instead of a package: without it ``import mymod``
would look like an installed package that has no distribution, and an edit of ``lib/mymod.py`` would be
skipped. A path is evaluated when it is built from literals, ``__file__`` and the usual
``os.path``/``pathlib`` calls (``dirname``, ``join``, ``abspath``, ``realpath``, ``Path(...).parent``,
``.parents[k]``, ``.resolve()``, ``/``), directly or through a name assigned so earlier
(``HERE = Path(__file__).resolve().parent``). One computed at run time (from a variable, a config)
cannot be seen: put the folder on ``PYTHONPATH`` instead, or install the code (``pip install -e``).
"""

from __future__ import annotations

import ast
import os

#: calls that add a folder to the import path: sys.path.append(x), sys.path.insert(i, x), site.addsitedir(x)
_ADDERS = {"append": 0, "insert": 1, "addsitedir": 0}
#: one-argument functions of a path, and methods of a Path, as they act on a string
_UNARY = {"dirname": os.path.dirname, "abspath": os.path.abspath, "realpath": os.path.realpath,
          "normpath": os.path.normpath, "expanduser": os.path.expanduser, "resolve": os.path.realpath,
          "absolute": os.path.abspath, "str": str, "fspath": str, "Path": str, "PurePath": str}


def additions(tree: ast.AST, filename: str) -> list[str]:
    """The folders ``tree`` (the module in ``filename``) adds to ``sys.path``, where they can be evaluated:
    absolute, or relative as written (the working directory where it runs decides)."""
    names: dict[str, str] = {}
    assigns = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1
                      and isinstance(n.targets[0], ast.Name)), key=lambda n: (n.lineno, n.col_offset))
    for node in assigns:
        value = _path(node.value, names, filename)
        if value is not None:
            names[node.targets[0].id] = value
        else:
            names.pop(node.targets[0].id, None)
    found = []
    for node in ast.walk(tree):
        for expr in _added(node):
            value = _path(expr, names, filename)
            if value:
                found.append(os.path.normpath(value))
    return sorted(set(found))


def _added(node: ast.AST) -> list[ast.expr]:
    """The expressions ``node`` adds to ``sys.path``: ``append``/``insert``/``extend``/``addsitedir``,
    ``sys.path += [...]``, ``sys.path[:0] = [...]``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        attr, owner = node.func.attr, node.func.value
        if attr == "addsitedir" or (attr in _ADDERS and _is_sys_path(owner)):
            position = _ADDERS[attr]
            return [node.args[position]] if len(node.args) > position else []
        if attr == "extend" and _is_sys_path(owner) and node.args:
            return _elements(node.args[0])
    if isinstance(node, ast.AugAssign) and _is_sys_path(node.target):
        return _elements(node.value)
    if isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) and _is_sys_path(t.value)
                                            for t in node.targets):
        return _elements(node.value)
    return []


def _is_sys_path(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def _elements(node: ast.AST) -> list[ast.expr]:
    return list(node.elts) if isinstance(node, (ast.List, ast.Tuple)) else []


def _path(node: ast.AST, names: dict[str, str], filename: str) -> str | None:
    """The string ``node`` evaluates to, if it is a path built as the module docstring says."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.Name):
        return os.path.abspath(filename) if node.id == "__file__" else names.get(node.id)
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = _path(node.value, names, filename)
        return os.path.dirname(inner) if inner is not None else None
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents" \
            and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
        inner = _path(node.value.value, names, filename)
        for _ in range(node.slice.value + 1 if inner is not None else 0):
            inner = os.path.dirname(inner)
        return inner
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.Add)):  # Path / "lib", HERE + "/lib"
        left, right = _path(node.left, names, filename), _path(node.right, names, filename)
        if left is None or right is None:
            return None
        return os.path.join(left, right) if isinstance(node.op, ast.Div) else left + right
    if isinstance(node, ast.JoinedStr):  # f"{HERE}/lib"
        parts = [_path(v.value if isinstance(v, ast.FormattedValue) and v.format_spec is None else v, names,
                       filename) for v in node.values]
        return "".join(parts) if all(isinstance(p, str) for p in parts) else None
    if isinstance(node, ast.Call):
        return _called(node, names, filename)
    return None


def _called(node: ast.Call, names: dict[str, str], filename: str) -> str | None:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    method_of = func.value if isinstance(func, ast.Attribute) and name in ("resolve", "absolute", "joinpath") \
        else None
    values = [_path(a, names, filename) for a in ([method_of] if method_of is not None else []) + list(node.args)]
    if node.keywords or not values or any(v is None for v in values):
        return None
    if name in ("join", "joinpath") or name in ("Path", "PurePath") and len(values) > 1:  # Path(HERE, "lib")
        return os.path.join(*values)
    if name in _UNARY and len(values) == 1:
        return _UNARY[name](values[0])
    return None
