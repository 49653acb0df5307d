"""Stages that outlive their batch block: submitted again, not failed.

A stage that stopped for its block's end exits 99 (``CONTINUE_EXIT``: its ranks saved
a checkpoint at the deadline), or its block was ended under it after the deadline.
Parsl's ``retry_handler`` hook sees the failure first: for a continuation it costs
nothing (``retries`` is left alone) and Parsl submits the task again; the task lands
in the next block (the old one takes no new stage from the deadline on) and resumes
from its checkpoint. A stage that was not started because a node failed the pre-flight
check (``launch.preflight``; the node is quarantined) is submitted again for free too, up to
MAX_FREE_PREFLIGHTS times. Other failures go to the user's ``retry_handler`` (or cost 1, as
Parsl's default). A stage that ends ``max_continuations`` blocks in a row without
progress (its checkpoint step does not move) fails with an error that says why.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...common import stagedir
from ...common.blocks import CONTINUE_EXIT
from ...common.outcome import Cause, read_outcome
from ...core.log import get_logger
from ...errors import ConfigError, StageError
from ..session.status import StatusFile

#: blocks in a row without progress before a continuing stage fails
DEFAULT_MAX_CONTINUATIONS = 3
#: pre-flight failures of a stage that cost no retry (each quarantines a node, so they end anyway)
MAX_FREE_PREFLIGHTS = 3


@dataclass
class _Stage:
    name: str
    directory: Path
    continuations: int = 0
    stalled: int = 0  # continuations in a row without progress
    step: Any = None
    preflights: int = 0  # pre-flight failures, each a quarantined node


def check_max_continuations(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"pt.workflow(max_continuations={value!r}): give the blocks in a row a stage may end "
                          f"without progress before it fails, an int >= 0 (default {DEFAULT_MAX_CONTINUATIONS})")
    return value


class Continuations:
    """The workflow's retry handler: continuations are free, other failures go to ``then``."""

    def __init__(self, status: StatusFile, max_continuations: int = DEFAULT_MAX_CONTINUATIONS,
                 then: Callable[[BaseException, Any], float] | None = None) -> None:
        self.status, self.max_continuations, self.then = status, max_continuations, then
        self._stages: dict[int, _Stage] = {}
        self._never: set[int] = set()
        self._lock = threading.Lock()
        self.log = get_logger("parsl_torch.workflow")

    def watch(self, task_id: int, stage: str, directory: Path) -> None:
        with self._lock:
            self._stages[task_id] = _Stage(stage, directory)

    def never(self, task_id: int) -> None:
        """A task that must not run again when it fails (a warm group: its call fails instead)."""
        with self._lock:
            self._never.add(task_id)

    def __call__(self, exc: BaseException, task_record: Any) -> float:
        if task_record["id"] in self._never:
            return math.inf
        stage = self._stages.get(task_record["id"])
        if stage is not None and is_continuation(exc, stage.directory):
            return self._continue(stage)
        if stage is not None and stage.preflights < MAX_FREE_PREFLIGHTS and _failed_preflight(stage.directory):
            stage.preflights += 1  # not started; its silent node is quarantined: the pool places it elsewhere
            self.log.warning("[%s] a node failed the pre-flight check: the stage goes to other nodes", stage.name)
            return 0.0
        return self.then(exc, task_record) if self.then is not None else 1.0

    def _continue(self, stage: _Stage) -> float:
        record = stagedir.read_or_none(stage.directory / stagedir.CONTINUATION, stagedir.ContinuationRecord, self.log)
        attempt = stagedir.read_or_none(stage.directory / stagedir.BLOCK, stagedir.BlockRecord, self.log)
        block = attempt.block if attempt else None
        if attempt and attempt.skipped:  # landed on a block past its deadline: not started, no block's time used
            self.log.info("[%s] block %s is past its deadline: the stage waits for the next block", stage.name, block)
            return 0.0
        step = record.step if record else None
        progressed = step is not None and (stage.step is None or step > stage.step)
        stage.stalled = 0 if progressed else stage.stalled + 1
        stage.step = step if progressed else stage.step
        stage.continuations += 1
        save, grace = (record.save_seconds, record.grace) if record else (None, None)
        slow = (f"; its last checkpoint took {save:.0f} s, longer than the grace period of {grace:.0f} s"
                if save and grace and save > grace else "")
        if stage.stalled > self.max_continuations:
            raise StageError(
                f"stage {stage.name!r} reached the end of {stage.stalled} blocks in a row without progress "
                f"(checkpoint at step {stage.step}){slow}: "
                f"{'raise the site provider.grace_period above that' if slow else 'give its blocks a longer walltime'}"
                f", or pt.workflow(max_continuations=...) (now {self.max_continuations})")
        at = f"at step {step}" if step is not None else "(no step reported)"
        self.log.warning("[%s] block %s ended %s: continuing in the next block (continuation %d%s)%s",
                         stage.name, block if block is not None else "?", at, stage.continuations,
                         "" if progressed else f", {stage.stalled} without progress", slow)
        self.status.stage(stage.name, state="waiting", submitted_at=time.time(),
                          continuations=stage.continuations, continued_at_step=step, ended_block=block)
        return 0.0


def _failed_preflight(stage_dir: Path) -> bool:
    outcome = read_outcome(stage_dir)
    return outcome is not None and outcome.cause is Cause.PREFLIGHT_FAILED


def is_continuation(exc: BaseException, stage_dir: Path) -> bool:
    """The stage stopped for its block's end (exit 99, and its supervisor's outcome says so: a script
    that exits 99 on its own, with no block end, failed), or lost its block after its deadline."""
    if getattr(exc, "exitcode", None) == CONTINUE_EXIT:
        outcome = read_outcome(stage_dir)
        return outcome is not None and outcome.cause is Cause.CONTINUED
    if type(exc).__name__ in ("ManagerLost", "WorkerLost"):  # Parsl's: the block ended under the stage
        block = stagedir.read_or_none(stage_dir / stagedir.BLOCK, stagedir.BlockRecord)
        return block is not None and block.deadline is not None and time.time() >= block.deadline
    return False
