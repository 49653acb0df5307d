"""A write that failed for want of space, said as such.

A full file system or a spent quota (a project's on Lustre, a home directory's) reaches the user as
torch's ``unexpected pos 2225792 vs 2225680`` when a checkpoint is saved, as HDF5's ``file write
failed`` in a history, or as a stage that failed with no record of why (its record could not be
written either): the errno is lost on the way. A small write beside the file finds it again, and the
error then says what to do.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

#: a full file system; a spent quota (Lustre's and NFS's user and project quotas)
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
#: what the probe writes: more than a file system keeps in reserve for metadata, less than any real file
_PROBE_BYTES = 1 << 16


def space_error(directory: str | os.PathLike) -> OSError | None:
    """The error a write in ``directory`` meets now for want of space (ENOSPC, EDQUOT), or None: the
    write (synced, where a network file system reports a quota only then) succeeded, or failed otherwise."""
    probe = Path(directory) / f".parsl-torch-space-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return exc if exc.errno in NO_SPACE else None
    try:
        os.write(fd, b"\0" * _PROBE_BYTES)
        os.fsync(fd)
    except OSError as exc:
        return exc if exc.errno in NO_SPACE else None
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
    return None


def free_text(directory: str | os.PathLike) -> str:
    """``0 B free`` / ``3.1 MB free`` on ``directory``'s file system (a quota's own room is not shown there)."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return "free space unknown"
    power = min(int(math.log10(free)) // 3, 4) if free >= 1000 else 0
    return f"{free / 1000 ** power:.3g} {('B', 'kB', 'MB', 'GB', 'TB')[power]} free"


def no_space(path: str | os.PathLike, exc: BaseException, kept: str = "") -> OSError | None:
    """An OSError saying that ``path`` could not be written for want of space, and what to do, when that
    is why ``exc`` was raised (its errno, or a write beside it failing now); else None. ``kept``: what the
    failed write left intact (``"the checkpoint saved before is kept"``). Call it before removing what the
    failed write left: that frees the space the probe would find."""
    directory = Path(path).parent
    cause = exc if isinstance(exc, OSError) and exc.errno in NO_SPACE else space_error(directory)
    if cause is None:
        return None
    what = "its file system is full" if cause.errno == errno.ENOSPC else "your disk quota there is spent"
    return OSError(cause.errno, f"cannot write {path}: {os.strerror(cause.errno)} ({what}; "
                                f"{free_text(directory)}): free space there (or have the quota raised), then run "
                                f"again{'; ' + kept if kept else ''}")


@contextlib.contextmanager
def said_when_full(path: str | os.PathLike, partial: Path, kept: str = "") -> Iterator[None]:
    """The block writes ``path`` through ``partial`` (a temporary file): where it fails, ``partial`` is removed,
    and a failure for want of space is raised as ``no_space``'s error (``kept``: what stays intact)."""
    try:
        yield
    except Exception as exc:
        full = no_space(path, exc, kept)  # (before the partial file is removed: that frees room)
        partial.unlink(missing_ok=True)
        if full is None:
            raise
        raise full from exc
