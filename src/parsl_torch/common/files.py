"""Small files that readers in other processes poll (status, progress, digests):
written whole or not at all."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def open_private(path: str | os.PathLike):
    """``path`` opened for writing in binary, readable by its owner only (0600: it may hold secrets), truncated."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``: a reader
    (or a crash) never sees half a file. The temporary name is unique per process and thread."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(text)
    except BaseException:
        tmp.unlink(missing_ok=True)  # (a full file system: the old file stays, and no half of a new one)
        raise
    os.replace(tmp, path)
