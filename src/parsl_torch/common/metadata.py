"""What a run records about itself: versions, git commit, machine, redacted config."""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

_SECRET = re.compile(r"secret|token|passw|api[_-]?key|credential|private[_-]?key|auth", re.I)
REDACTED = "***"


def redact(value: Any) -> Any:
    """A copy of ``value`` with every entry whose key looks secret replaced by ***."""
    if isinstance(value, Mapping):
        return {k: REDACTED if _SECRET.search(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def package_versions() -> dict[str, str]:
    import importlib.metadata  # ~20 ms: only when asked

    versions = {"python": sys.version.split()[0]}
    for dist in ("parsl-torch", "torch", "numpy", "h5py", "mpi4py", "parsl", "wandb", "globus-compute-sdk"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def git_commit() -> str:
    """HEAD of the git repository around the current directory, or ''."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""
