"""What Linux's /proc says about a process: enough to tell a live process from a
zombie, find its parent, and tell it apart from a later one with the same PID."""

from __future__ import annotations

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
