"""Files a stage's user modules name: what the code reads without being told (``open(config.DATA)``).

A module's string literals that name an existing file (``"/data/table.csv"``, ``"data/vocab.json"``: where
the workflow runs, or else in the module's folder, as ``os.path.join(HERE, "data/vocab.json")`` reads it),
and, for a module the workflow has imported, the files its globals hold (``DATA =
Path(__file__).parent / "data" / "table.csv"``; in a list, tuple, set or dict too). Each is an input
of the stage: its content joins the identity, so a regenerated data file reruns the stages whose
modules name it. A folder a module names is a place (``LOG_DIR``, ``CKPT_DIR``, a run directory:
what is in it changes with every run), not an input; a data folder, or a path built inside a
function at run time, must be named in ``inputs=``.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import PurePath
from typing import Any

from ..scriptargs import PathNames, is_pattern
from .usercode import Reached

#: a container global holding more values than this is data, not a list of paths: looked at no further
MAX_ITEMS = 1000
#: the most strings of one module's globals looked up (a module of tables costs no more than this)
MAX_TEXTS = 10_000


def named_files(reached: Reached) -> set[str]:
    """The existing files (absolute paths) that the reached user modules name."""
    paths, near = PathNames(), {}  # a literal names a file where the workflow runs, or beside its module
    found = {p for folder, text in reached.literals
             if (p := paths.named(text) or near.setdefault(folder, PathNames(folder)).named(text)) is not None}
    for file, name in reached.names.items():
        module = sys.modules.get(name)
        if module is None or os.path.realpath(getattr(module, "__file__", None) or "") != file:
            continue  # not imported here (only the ranks import it), or another module of that name
        texts = (text for key, value in list(vars(module).items()) if not key.startswith("__")
                 for text in _path_texts(value, 0))
        found.update(p for text in itertools.islice(texts, MAX_TEXTS) if (p := paths.named(text)) is not None)
    return {path for path in found if os.path.isfile(path) or is_pattern(path)}


def _path_texts(value: Any, depth: int) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, PurePath):
        yield str(value)
    elif depth < 2 and isinstance(value, (list, tuple, set, frozenset, dict)) and len(value) <= MAX_ITEMS:
        for item in value.values() if isinstance(value, dict) else value:
            yield from _path_texts(item, depth + 1)
