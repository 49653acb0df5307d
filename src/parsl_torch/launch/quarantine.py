"""Nodes a block must not hand out again: a stage's supervisor records a node it names lost (no
heartbeat, or its processes vanished), keyed by the batch job it belongs to, in the workflow's
quarantine file (``<run_dir>/parsl/quarantine.json``); parsl-torch's worker pool
(``launch.pool``) reads it before it takes a task's nodes back, and ``parsl-torch status``
lists it. A node name is quarantined in its job only: the next job may get a repaired node of
that name."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Mapping
from pathlib import Path

from ..common.files import write_atomic
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


def add(path: str | os.PathLike, job: str, node: str, why: str) -> None:
    """Record ``node`` of ``job`` as lost (several supervisors may write at once: one at a time)."""
    path = Path(path)
    with contextlib.suppress(OSError), open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = read(path)
        data.setdefault(job, {})[node] = why
        write_atomic(path, json.dumps(data, indent=1, sort_keys=True))
