"""Fault injection for the resilience tests (``PARSL_TORCH_FAULT``, in the settings registry).

Installed once per stage as a forward pre-hook of the model, so no line of the training loop
is about it: ``kill|hang@RANK:STEP[:ONCE_FILE]`` (that rank dies, or hangs, as step STEP starts;
with ONCE_FILE only the first time) and ``slow@RANK:SECONDS`` (that rank takes SECONDS longer
every step: a training time no machine beats). ``killsave@RANK:STEP`` kills the rank inside a
sharded checkpoint's save (``checkpoint``: after its shards of STEP are written). Several step
faults: separated by ``;``.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path
from typing import Any

from ..common import settings


def install(model: Any, rank: int, first_step: int) -> None:
    """The step faults of ``PARSL_TORCH_FAULT`` on ``model``, whose forward runs once per step from
    ``first_step`` (nothing without the variable)."""
    spec = settings.FAULT.get()
    if not spec or spec.startswith("killsave@"):
        return
    steps = itertools.count(first_step)

    def before_forward(_module: Any, _args: Any) -> None:
        step = next(steps)
        for one in spec.split(";"):
            _at_step(one, rank, step)

    import torch

    if hasattr(model, "step"):  # a pipeline runs whole steps (core.pipeline): no forward of its own
        whole_step = model.step

        def step_after_the_faults(*args: Any) -> Any:
            before_forward(model, args)
            return whole_step(*args)

        model.step = step_after_the_faults
        return
    model.register_forward_pre_hook(torch.compiler.disable(before_forward))


def _at_step(spec: str, rank: int, step: int) -> None:
    kind, _, where = spec.partition("@")
    if kind == "slow":
        slow_rank, seconds = where.split(":")
        if rank == int(slow_rank):
            time.sleep(float(seconds))
        return
    fault_rank, fault_step, *once = where.split(":", 2)
    if (rank, step) != (int(fault_rank), int(fault_step)):
        return
    if once:
        marker = Path(once[0])
        if marker.exists():
            return
        marker.touch()
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while kind == "hang":
        time.sleep(3600)


def in_save(rank: int, step: int) -> None:
    """``killsave@RANK:STEP``: that rank dies after writing its shards of the checkpoint of STEP,
    before the others finish."""
    spec = settings.FAULT.get() or ""
    if spec.startswith("killsave@") and spec.split("@", 1)[1] == f"{rank}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
