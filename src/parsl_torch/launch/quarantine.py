"""Nodes a block must not hand out again: a stage's supervisor records a node it names lost (no
heartbeat, or its processes vanished), keyed by the batch job it belongs to, in the workflow's
quarantine file (``<run_dir>/parsl/quarantine.json``); parsl-torch's worker pool
(``launch.pool``) reads it before it takes a task's nodes back, and ``parsl-torch status``
lists it. A node name is quarantined in its job only: the next job may get a repaired node of
that name. Beside it, the block's spares that are taken (``spares.json``): a supervisor claims one to
go on in place after a loss, the pool gives them back to the block; no spare is given twice."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from ..common.files import write_atomic
from .events import short
from .schedulers import SCHEDULERS

#: the quarantine file in a workflow's Parsl directory
FILE = "quarantine.json"


def job_of(env: Mapping[str, str] | None = None) -> str | None:
    """The batch job this process runs in (Slurm, PBS, ...), None outside one."""
    env = os.environ if env is None else env
    return next((env[s.job_id_var] for s in SCHEDULERS.values() if s.job_id_var and env.get(s.job_id_var)), None)


def read(path: str | os.PathLike) -> dict[str, dict[str, str]]:
    """job -> {node: why}; empty when there is no file (or it cannot be read: nothing is quarantined)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return {str(j): {str(n): str(w) for n, w in nodes.items()} for j, nodes in data.items()
            if isinstance(nodes, dict)} if isinstance(data, dict) else {}


def lost_nodes(path: str | os.PathLike, job: str | None) -> set[str]:
    return set(read(path).get(job or "", {})) if job else set()


@contextlib.contextmanager
def _locked(path: str | os.PathLike, job: str, name: str = "") -> Iterator[dict[str, str]]:
    """This job's entries in the quarantine file (``name``: in the file of that name beside it), changed in place
    and written back if changed, one process at a time (the quarantine file's lock: supervisors that record lost
    nodes, a supervisor's claim of a spare and the pool's release must not interleave)."""
    file = Path(path).with_name(name) if name else Path(path)
    with open(Path(path).with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = read(file)
        held = data.setdefault(job, {})
        before = dict(held)
        yield held
        if held != before:
            write_atomic(file, json.dumps(data, indent=1, sort_keys=True))


def add(path: str | os.PathLike, job: str, node: str, why: str) -> None:
    """Record ``node`` of ``job`` as lost (several supervisors may write at once: one at a time)."""
    with contextlib.suppress(OSError), _locked(path, job) as lost:
        lost[node] = why


# -- spares: a block's nodes held back for lost ones -------------------------------------------
#: beside the quarantine file: job -> {spare node: who holds it}, a spare no one else may take
SPARES_FILE = "spares.json"
#: the holder of a spare that the block's pool gave back to its free nodes
THE_BLOCK = "the block"


def claim_spare(path: str | os.PathLike, job: str, offered: Sequence[str], holder: str) -> str | None:
    """One of the spares ``offered`` to a stage (those its block held back when it started) that is neither
    lost nor taken, now ``holder``'s (a stage's nodes, as its pool granted them); None when none is left."""
    lost = {short(n) for n in lost_nodes(path, job)}
    with _locked(path, job, SPARES_FILE) as held:
        spare = next((s for s in offered if s and s not in held and short(s) not in lost), None)
        if spare is not None:
            held[spare] = holder
    return spare


def release_spares(path: str | os.PathLike, job: str, spares: Sequence[str], holder: str, losses: int) -> list[str]:
    """Of the block's ``spares``, those to give back to its free nodes when the stage ``holder`` ends having lost
    ``losses`` of its nodes: those it claimed (it has ended), then untaken ones for the losses its claims did not
    replace (a claimed spare that was lost too is one more loss). Each is marked the block's."""
    lost = {short(n) for n in lost_nodes(path, job)}
    with _locked(path, job, SPARES_FILE) as held:
        claimed = [s for s in spares if held.get(s) == holder]
        replaced = len([s for s in claimed if short(s) not in lost])
        free = [s for s in reversed(spares) if s not in held]
        released = claimed + free[:max(losses - replaced, 0)]
        held.update({s: f"{THE_BLOCK}'s, after the stage on {held[s]}" if s in claimed else f"{THE_BLOCK}'s"
                     for s in released})
    return released
