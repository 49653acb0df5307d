"""A script stage's command line: its name, and the arguments that name files (made absolute where
the workflow runs, and read as the stage's inputs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


#: script stems that say nothing about the script: the stage is named after its folder
GENERIC_STEMS = ("main", "__main__", "run", "script", "app", "cli")


def script_stage_name(script: str | os.PathLike, module: bool) -> str:
    """``mingpt/main.py`` -> ``mingpt``; ``pkg.train`` -> ``train``; ``pkg.__main__`` -> ``pkg``."""
    parts = str(script).split(".") if module else [*Path(os.path.abspath(script)).parent.parts[-1:],
                                                     Path(script).stem]
    if len(parts) > 1 and parts[-1] in GENERIC_STEMS and parts[-2] not in ("", os.sep):
        return parts[-2]
    return parts[-1]


def caller_path(arg: Any) -> Any:
    """An argument naming an existing file or directory relative to the caller (``data/x.npy``,
    ``--data=data/x.npy``, a ``Path``) made absolute: the ranks start in the stage's directory."""
    if isinstance(arg, os.PathLike) and not hasattr(arg, "filepath"):
        return os.path.abspath(arg)
    if not isinstance(arg, str) or not arg or os.path.isabs(arg):
        return arg
    flag, eq, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
    if value and not os.path.isabs(value) and os.path.exists(value):
        return f"{flag}{eq}{os.path.abspath(value)}"
    return arg


def named_path(arg: Any) -> str | None:
    """The existing file or directory an argument names (after ``caller_path``): ``/d/x.npy``,
    ``--data=/d/x.npy``, a ``Path``; None for anything else."""
    if isinstance(arg, os.PathLike) and not hasattr(arg, "filepath"):
        arg = os.fspath(arg)
    if not isinstance(arg, str):
        return None
    value = arg.partition("=")[2] if arg.startswith("-") else arg
    return value if value and os.path.isabs(value) and os.path.exists(value) else None
