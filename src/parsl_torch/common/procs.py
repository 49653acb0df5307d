"""What Linux's /proc says about a process (enough to tell a live process from a zombie, find its
parent, and tell it apart from a later one with the same PID), and stopping processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple


class ProcStat(NamedTuple):
    state: str  # R, S, D, Z (zombie), ...
    ppid: int
    start: str  # clock ticks since boot at which it started


def proc_stat(pid: int | str) -> ProcStat | None:
    """``/proc/PID/stat``'s state, parent and start time; None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name in () may hold spaces
        return ProcStat(fields[0], int(fields[1]), fields[19])
    except (OSError, IndexError, ValueError):
        return None


def reap(token: str, spare: frozenset[int] = frozenset()) -> int:
    """SIGKILL local processes whose environment carries ``token`` (not those in ``spare``);
    returns how many."""
    killed = 0
    needle = token.encode()
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid() or int(entry.name) in spare:
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
        except OSError:
            continue
    return killed


def stop(proc: subprocess.Popen, grace: float, done: Callable[[], bool] | None = None) -> None:
    """SIGTERM to a process and its process group, SIGKILL if they are not gone after ``grace`` s, or as soon
    as ``done()`` says what mattered has ended (a launcher may wait on a lost node's daemon for ever)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            if sig is signal.SIGTERM and done is not None and done():
                break
            time.sleep(0.05)
        if proc.poll() is not None:
            return
