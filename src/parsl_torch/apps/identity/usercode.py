"""Which Python files are the user's, and which of them a stage can run.

User code is every ``.py`` file (and compiled extension module: a kernel
built in place) outside this Python's installation (the
standard library, site-packages) and outside parsl-torch itself: the
workflow script's folder, ``PYTHONPATH`` folders, the sources of editable
installs (``pip install -e``: a path entry, or an import hook that maps the package to its sources,
``find_spec``). A stage can run the user modules its code imports, and those they import in turn:
found before it runs by reading each file's ``import`` statements (all of them, also inside
functions; ``importlib.import_module("helpers")`` too), resolved on the import path the ranks get
(:func:`rank_import_path`). What only running finds (a module imported by a computed name, from a
folder added to ``sys.path``) is among what the stage was seen to read (``identity.reads``).

A module's digest is that of its syntax tree (``ast.dump`` without
positions): comments, blank lines and code moving to other lines do not
change it; any change of what runs does. The same reading keeps the
top-level names of the modules it imports that are not the user's (an installed
package's version and files join the identity: ``identity.packages``).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import os
import site
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib.machinery import EXTENSION_SUFFIXES, PathFinder
from pathlib import Path
from typing import Any, NamedTuple, Protocol

#: the package itself is the runtime, not the user's code (its version and sources are in every
#: stage's identity: ``identity.runtime_digest``)
PACKAGE_DIR = str(Path(__file__).resolve().parents[2])  # parsl_torch/ (this is parsl_torch/apps/identity/)
#: functions that import a module named by a string
MODULE_IMPORTERS = ("import_module", "__import__")


class ParsedModule(NamedTuple):
    """What reading a module tells (``parse_module``)."""

    digest: str  # of its syntax tree
    imports: list[list[Any]]  # [level, module or "", [names]]


class ModuleCache(Protocol):
    """Where parsed modules are remembered (by path, size, mtime, ctime and inode): ``identity.DigestCache``,
    whose ``module`` returns ``parse_module``'s answer."""

    def module(self, path: str) -> ParsedModule: ...


@functools.lru_cache(maxsize=1)
def _installation_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.update(getattr(site, "getsitepackages", lambda: [])())
    roots.add(site.getusersitepackages() if hasattr(site, "getusersitepackages") else "")
    roots.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    return tuple(sorted(os.path.realpath(r) for r in roots if r))


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def is_user_file(path: str | os.PathLike | None) -> bool:
    """A ``.py`` file of the user's (see the module docstring)."""
    if not path:
        return False
    real = os.path.realpath(path)
    return real.endswith(".py") and os.path.isfile(real) and not _under(real, (*_installation_roots(), PACKAGE_DIR))


def is_user_extension(path: str | os.PathLike | None) -> bool:
    """A compiled extension module of the user's (``python setup.py build_ext --inplace``: a custom kernel
    built beside the sources): its bytes are its code (``parse_module`` digests what does not parse)."""
    if not path:
        return False
    real = os.path.realpath(path)
    return (real.endswith(tuple(EXTENSION_SUFFIXES)) and os.path.isfile(real)
            and not _under(real, (*_installation_roots(), PACKAGE_DIR)))


def is_user_dir(path: str) -> bool:
    real = os.path.realpath(path)
    return os.path.isdir(real) and not _under(real, (*_installation_roots(), PACKAGE_DIR))


def rank_import_path(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The ``PYTHONPATH`` for a stage's ranks: this process's import path as far as it is the user's
    (the workflow script's folder, the working directory for ``python -c``/notebooks) and
    whatever ``PYTHONPATH`` already held, in ``sys.path`` order. The ranks start in the stage's
    directory, so without it ``import mymod`` works in the workflow and fails on the ranks."""
    environ = os.environ if environ is None else environ
    given = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    kept: list[str] = []
    for entry in sys.path:
        entry = os.path.abspath(entry or os.getcwd())
        if entry not in kept and (entry in given or is_user_dir(entry)):
            kept.append(entry)
    kept += [p for p in given if p not in kept]
    return tuple(kept)


def parse_module(source: bytes, filename: str) -> ParsedModule:
    """What the module in ``filename`` imports, and the digest of its syntax tree."""
    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError):  # the ranks will say what is wrong; any byte change reruns it
        return ParsedModule("bytes:" + hashlib.sha256(source).hexdigest(), [])
    imports: list[list[Any]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports += [[0, alias.name, []] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            imports.append([node.level, node.module or "", [a.name for a in node.names if a.name != "*"]])
        elif isinstance(node, ast.Call) and _name_of(node.func) in MODULE_IMPORTERS and (name := _literal(node)):
            level = len(name) - len(name.lstrip("."))
            imports.append([level, name[level:], []])
    return ParsedModule(hashlib.sha256(ast.dump(tree).encode()).hexdigest(), imports)


def _name_of(node: ast.AST) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


def _literal(call: ast.Call) -> str | None:
    """The call's first argument when it is a string literal."""
    first = call.args[0] if call.args else None
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def find_spec(name: str, path: Sequence[str] | None, search: Sequence[str] | None = None) -> Any:
    """Where ``name`` would be imported from, without importing it: on ``path`` (a package's folders), else
    on ``search`` (``sys.path`` when None) or through an import hook of this Python's (``pip install -e``
    installs a finder that maps the package to its sources: they are the user's)."""
    spec = PathFinder.find_spec(name, list(path) if path is not None else search)
    if spec is None and path is None:
        for finder in sys.meta_path:
            if finder is PathFinder or not hasattr(finder, "find_spec") or \
                    getattr(finder, "__module__", "").startswith(("importlib", "_frozen_importlib")):
                continue
            with contextlib.suppress(Exception):  # (a hook that fails here fails the import on the ranks)
                if (spec := finder.find_spec(name, None)) is not None:
                    break
    return spec


def _find(name: str, search: Sequence[str]) -> list[tuple[str, str, bool]]:
    """(file, module name, is a package) for ``name`` and each package above it, where they are the
    user's; stops at the first part that is not (an installed package, the standard library)."""
    found, locations = [], list(search)
    parts = name.split(".")
    for i in range(len(parts)):
        full = ".".join(parts[: i + 1])
        try:
            spec = find_spec(full, locations if i else None, search)
        except (ImportError, ValueError):
            return found
        if spec is None or not (is_user_file(spec.origin) or is_user_extension(spec.origin)):
            return found
        package = spec.submodule_search_locations is not None
        found.append((os.path.realpath(spec.origin), full, package))
        if not package:
            return found
        locations = list(spec.submodule_search_locations)
    return found


def user_files(name: str, search: Sequence[str]) -> list[tuple[str, str]]:
    """(file, module name) of module ``name`` and the packages above it that are the user's, found on ``search``."""
    return [(file, module) for file, module, _ in _find(name, search)]


def _targets(imports: list[list[Any]], module: str, is_package: bool) -> list[str]:
    """The absolute module names an import list can load (``from pkg import x``: pkg, and pkg.x if a module)."""
    names = []
    package = module if is_package else module.rpartition(".")[0]
    for level, target, items in imports:
        if level:
            base = package.split(".")
            if level - 1 > len(base) or not package:
                continue  # a relative import outside any package fails on the ranks too
            base = base[: len(base) - (level - 1)]
            target = ".".join([*base, *([target] if target else [])])
        if target:
            names.append(target)
        names += [f"{target}.{item}" if target else item for item in items]
    return names


@dataclass
class Reached:
    """What a stage's code can run: each user module's digest and name (by file), and the installed
    top-level modules they import."""

    digests: dict[str, str] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    packages: set[str] = field(default_factory=set)


def user_modules(roots: Iterable[tuple[str, str]], search: Sequence[str], cache: ModuleCache) -> Reached:
    """Each user module the ``roots`` ((file, module name) pairs) can import, themselves included,
    following imports transitively on ``search`` (the ranks' ``sys.path``)."""
    roots = list(roots)
    # a script's own folder comes first on its sys.path, for every module it imports
    search = [*(os.path.dirname(f) for f, m in roots if m == "__main__"), *search]
    reached = Reached()
    todo = [(os.path.realpath(f), m, os.path.basename(f) == "__init__.py") for f, m in roots if os.path.isfile(f)]
    queued = {f for f, _, _ in todo}
    while todo:
        path, module, is_package = todo.pop()
        parsed = cache.module(path)
        reached.digests[path], reached.names[path] = parsed.digest, module
        for name in _targets(parsed.imports, module, is_package):
            found = _find(name, search)
            if not found:  # the standard library, an installed package (or nothing: the ranks will say)
                reached.packages.add(name.partition(".")[0])
            for file, found_name, package in found:
                if file not in queued:
                    queued.add(file)
                    todo.append((file, found_name, package))
    reached.digests = dict(sorted(reached.digests.items()))
    return reached


def module_origin(name: str, search: Sequence[str]) -> list[tuple[str, str]]:
    """The files ``python -m name`` runs, as roots: the module, or a package's ``__init__`` and ``__main__``."""
    found = _find(name, search)
    if not found or found[-1][1] != name:
        return []
    path, full, package = found[-1]
    roots = [(f, m) for f, m, _ in found]
    if package:
        main = os.path.join(os.path.dirname(path), "__main__.py")
        if is_user_file(main):
            roots.append((os.path.realpath(main), f"{full}.__main__"))
    return roots


def display_name(path: str) -> str:
    """A module's path as the log shows it: relative to the working directory when under it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel
