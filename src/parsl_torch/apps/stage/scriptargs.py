"""A script stage's command line: its name, and the arguments that name files (or a glob pattern
that matches files: ``data/shard_*.bin``), made absolute where the workflow runs: the ranks start
in the stage's directory. What the script then reads is observed (``identity.observed``)."""

from __future__ import annotations

import glob
import itertools
import os
import re
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ...observe.native import python_program
from ...errors import ConfigError

#: a glob pattern's characters
_MAGIC = re.compile(r"[*?[]")
#: the most matches of one glob pattern looked at (they are listed at every call, as a directory's files)
MAX_MATCHES = 100_000


def is_pattern(path: str) -> bool:
    """A glob pattern (``data/shard_*.bin``, ``data/**/*.npy``), not a file whose name holds ``*``, ``?``
    or ``[``."""
    return bool(_MAGIC.search(path)) and not os.path.lexists(path)


def pattern_files(pattern: str) -> list[str]:
    """The files a glob pattern matches (``**``: in any folder below), in order."""
    files = (m for m in glob.iglob(pattern, recursive=True) if os.path.isfile(m))
    return sorted(itertools.islice(files, MAX_MATCHES))


def _names(path: str) -> bool:
    """``path`` exists, or is a glob pattern that matches a file."""
    return os.path.exists(path) or is_pattern(path) and any(
        os.path.isfile(m) for m in itertools.islice(glob.iglob(path, recursive=True), MAX_MATCHES))


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
    """An argument naming an existing file or directory (or a glob pattern's files) relative to the caller
    (``data/x.npy``, ``--data=data/x.npy``, a ``Path``) made absolute: the ranks start in the stage's
    directory."""
    if isinstance(arg, os.PathLike) and not hasattr(arg, "filepath"):
        return os.path.abspath(arg)
    if not isinstance(arg, str) or not arg or os.path.isabs(arg):
        return arg
    flag, eq, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
    if value and not os.path.isabs(value) and _names(value):
        return f"{flag}{eq}{os.path.abspath(value)}"
    return arg


def script_command_length(script: Sequence[Any]) -> int:
    """How many words of a script stage's command line run it (``python FILE``, ``python -m MODULE``, a
    program's ``FILE``): code, not arguments."""
    if not script or not python_program(str(script[0])):
        return min(len(script), 1)
    return 3 if len(script) > 2 and script[1] == "-m" else min(len(script), 2)


def runs_python(path: str | os.PathLike) -> bool:
    """Whether a script stage's file is Python (run by the stage's Python) rather than a program run as it is
    (a shell script, a binary): a ``.py`` file, a ``python`` "#!" line, or a file that is not executable."""
    if str(path).endswith((".py", ".pyw")) or not os.access(path, os.X_OK):
        return True
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return True
    return first.startswith(b"#!") and b"python" in first


def check_script_argument(arg: Any, where: str) -> None:
    """A word of a script's command line: a string, a number, a path, a File or a future (a previous
    stage's ``outputs[i]``, resolved to its path); anything else has no text a script could parse."""
    if hasattr(arg, "filepath") or (isinstance(arg, (str, int, float, os.PathLike, Future))
                                    and not isinstance(arg, bool)):
        return
    raise ConfigError(f"{where}: argument {arg!r} ({type(arg).__name__}) cannot go on a script's command line: "
                      f"give strings, numbers, paths, Files or a previous stage's outputs[i]")


def script_word(arg: Any, outputs: Sequence[Any], stage_dir: os.PathLike | str) -> Any:
    """``arg`` as the ranks see it: naming one of the call's ``outputs`` (``ckpt.pt``,
    ``--out=ckpt.pt``), that output's path in ``stage_dir`` (never a file of the same name where the
    workflow runs); else as ``caller_path`` makes it. Futures and Files are left for ``command_text``."""
    if isinstance(arg, os.PathLike) and not hasattr(arg, "filepath"):
        arg = os.fspath(arg)
    if not isinstance(arg, str):
        return arg
    flag, eq, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
    if value and (output := _output_named(value, outputs, stage_dir)) is not None:
        return f"{flag}{eq}{output}"
    return caller_path(arg)


def _output_named(value: str, outputs: Sequence[Any], stage_dir: os.PathLike | str) -> str | None:
    """The path in ``stage_dir`` of the output that ``value`` names, if it names one."""
    for output in outputs:
        if not (isinstance(output, (str, os.PathLike)) or hasattr(output, "filepath")):
            continue
        name = command_text(output)
        placed = name if os.path.isabs(name) else os.path.join(os.fspath(stage_dir), name)
        if os.path.normpath(value) in (os.path.normpath(name), os.path.normpath(placed)):
            return os.path.normpath(placed)
    return None


def command_text(arg: Any) -> str:
    """A resolved script argument as a word of the command line: a File's path, a path, a number."""
    if hasattr(arg, "filepath"):
        return str(arg.filepath)
    return os.fspath(arg) if isinstance(arg, os.PathLike) else str(arg)
