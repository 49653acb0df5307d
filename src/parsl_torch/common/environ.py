"""This Python's environment: its bin folder first on PATH, tools beside it.

Parsl starts its workers, and launchers their ranks, by program name, so the
environment the workflow runs in must come first on PATH wherever a child
process is started (workflow scripts, the doctor's smoke run, local worker
start-up lines).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path


def python_bin() -> Path:
    """The folder of this Python's executable (a venv's bin)."""
    return Path(sys.executable).parent


def path_with_python_bin(env: Mapping[str, str] | None = None) -> str:
    """``PATH`` of ``env`` (default: this process's) with this Python's bin first."""
    env = os.environ if env is None else env
    current = env.get("PATH", "")
    return f"{python_bin()}{os.pathsep}{current}" if current else str(python_bin())


def find_local_tool(name: str) -> str | None:
    """``name`` beside this Python (the venv's bin) first, then on PATH."""
    beside = python_bin() / name
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which(name)
