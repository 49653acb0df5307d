"""The config files a Hydra application reads, which its code and configs name without a path.

``@hydra.main(config_path="conf", config_name="config")`` (or ``initialize(config_path=...)`` or
``initialize_config_dir(config_dir=...)`` with ``compose(config_name=...)``) reads
``conf/config.yaml`` beside the module, and that config's defaults list (``defaults: [model: gpt,
db/mysql, _self_]``) reads ``conf/model/gpt.yaml`` and ``conf/db/mysql.yaml``: a group's path is
relative to the config that names it, or to a folder above it with a leading ``/``. None of those
names is a path, so without this an edit of ``conf/model/gpt.yaml`` (a learning rate) would not
rerun the stage. Hydra itself is not imported: the names are read from the syntax tree and the
parsed YAML. Overrides given on the command line (``model=gpt2``) are arguments.
"""

from __future__ import annotations

import ast
import os
from typing import Any

#: what a defaults list names that is no config file
_NOT_FILES = ("_self_", "null", "None")
#: folders above a config looked in for a group with a leading / (the config root)
_ROOT_LEVELS = 3


def primary_configs(tree: ast.AST) -> list[str]:
    """The primary config files a module's code names to Hydra, relative to the module's folder (as Hydra
    reads ``config_path``)."""
    paths: list[str] = []
    folders = [v for node in ast.walk(tree) for call, key in (("initialize", "config_path"),
                                                              ("initialize_config_dir", "config_dir"))
               if _called(node, call) and (v := _keyword(node, key))]
    for node in ast.walk(tree):
        name = _keyword(node, "config_name") if _called(node, "main") or _called(node, "compose") else None
        if not name:
            continue
        where = [_keyword(node, "config_path")] if _called(node, "main") else folders
        for folder in [f for f in where if f] or ["."]:
            path = os.path.join(folder, name)
            paths.append(path if path.endswith((".yaml", ".yml")) else path + ".yaml")
    return paths


def _called(node: ast.AST, name: str) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return (isinstance(func, ast.Attribute) and func.attr == name) or (isinstance(func, ast.Name) and func.id == name)


def _keyword(node: ast.AST, name: str) -> str | None:
    for keyword in getattr(node, "keywords", ()):
        if keyword.arg == name and isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, str):
            return keyword.value.value
    return None


def defaults_files(config: str, data: Any) -> list[str]:
    """The existing config files the defaults list of ``data`` (the parsed ``config``) names."""
    entries = data.get("defaults") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return []
    folder = os.path.dirname(os.path.abspath(config))
    found = []
    for group, name in (pair for entry in entries[:1000] for pair in _pairs(entry)):
        relative = os.path.join(group.lstrip("/"), name)
        relative = relative if relative.endswith((".yaml", ".yml")) else relative + ".yaml"
        above = [folder]
        for _ in range(_ROOT_LEVELS if (group or name).startswith("/") else 0):
            above.append(os.path.dirname(above[-1]))
        found += [p for p in (os.path.join(base, relative) for base in above) if os.path.isfile(p)][:1]
    return found


def _pairs(entry: Any) -> list[tuple[str, str]]:
    """(group, name) of one defaults entry: ``model: gpt`` (``override``, ``optional`` and ``@package`` left
    out; a list of names: each), ``db/mysql``; nothing for ``_self_`` or ``null``."""
    if isinstance(entry, str):
        pairs = [("", entry)]
    elif isinstance(entry, dict) and len(entry) == 1:
        (key, names), = entry.items()
        group = str(key).split("@")[0].split()[-1] if str(key).strip() else ""
        pairs = [(group, n) for n in (names if isinstance(names, list) else [names]) if isinstance(n, str)]
    else:
        return []
    return [(group, name.split("@")[0]) for group, name in pairs if name and name not in _NOT_FILES]
