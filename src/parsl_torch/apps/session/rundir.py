"""The run directory: whether it is parsl-torch's to use, starting over in it, and the names
of the stage folders inside it (one safe folder name each: nothing outside is ever touched)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from ...common.runlock import LOCK
from ...errors import ConfigError

#: in a run directory parsl-torch made
MARKER = ".parsl-torch-run"
#: a stage's directory is one folder under the run directory: these characters, these lengths
STAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
#: names the run directory already uses for itself
RESERVED_NAMES = ("parsl", "status.json", "report.md")


def check_stage_name(name: Any, explicit: bool) -> None:
    """A stage name is one safe folder name under the run directory, never a path or a reserved name."""
    given = "stage=" if explicit else "the stage's name (name= on the decorator or script_app)"
    if not isinstance(name, str) or not STAGE_NAME.fullmatch(name) or name.lower() in RESERVED_NAMES:
        raise ConfigError(f"{given} {name!r} is not a stage name: use 1-100 letters, digits, '.', '_' or '-', "
                          f"starting with a letter or digit, not {', '.join(RESERVED_NAMES)} (each stage is one "
                          f"folder under the run directory)")


#: characters of a run directory's path that Parsl's providers hand to a shell unquoted, or format away, and
#: that its File reads as a URL's (``#``, ``?``: the stages' files would be cut there)
UNSAFE_PATH = re.compile(r"""[\s'"$`\\;&|<>(){}#?]""")


def check_ours(run_dir: Path) -> None:
    """A run directory is new, empty or parsl-torch's (its marker): anything else is the user's.
    Its path is one Parsl can use: its providers write and run scripts under it unquoted (a space
    left the workers unstarted and the workflow waiting forever)."""
    if bad := sorted(set(UNSAFE_PATH.findall(str(run_dir)))):
        raise ConfigError(f"run directory {str(run_dir)!r}: its path has {' '.join(map(repr, bad))}, which Parsl's "
                          f"providers pass to a shell unquoted (its workers would never start) or its File reads "
                          f"as part of a URL (the stages' files would be cut there): pick a path of "
                          f"letters, digits and . _ - + , @ = : % / (nothing was made)")
    if run_dir.is_symlink() and not run_dir.exists():
        raise ConfigError(f"run directory {run_dir} is a link to {os.readlink(run_dir)}, which does not exist: "
                          f"create that directory or pick another --run-dir")
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir} is a file, not a directory: pick another --run-dir "
                          f"(nothing there was touched)")
    if run_dir.exists() and any(run_dir.iterdir()) and not (run_dir / MARKER).exists():
        raise ConfigError(f"run directory {run_dir} exists and was not made by parsl-torch: "
                          f"pick a new --run-dir (nothing there was touched)")


def prepare(run_dir: Path, fresh: bool) -> None:
    """Under the run directory's lock: start over if asked (the lock stays), mark it ours."""
    if fresh:
        for entry in run_dir.iterdir():
            if entry.name != LOCK:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    (run_dir / MARKER).touch()
