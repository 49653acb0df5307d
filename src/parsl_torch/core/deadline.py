"""Stopping before the batch block ends, on every rank at the same step.

A rank learns that its block is ending from ``PARSL_TORCH_DEADLINE`` (set by the
supervisor: the block's end less the site's grace period, or ``parsl-torch launch
--deadline``) and from SIGUSR1, which the supervisor's shim sends at that instant to
ranks that catch it (as Slurm's ``--signal`` would). Ranks must agree on the step at
which they stop, or one saves while another waits in a collective: each
``should_checkpoint()`` call starts a small all-reduce (max) of this rank's view in the
background and answers with the previous call's result, so every rank gets the same
answer at the same call and nobody waits for it.

Stopping takes time: the agreement lags by one step, the deadline may fall just after
a call, and then the checkpoint is written. When that (two steps and the longest save
seen, with a margin) needs more than the grace period, a rank stops that much before
the block's end instead: a stage whose checkpoints are big gets a longer grace period
by itself, from its first save on (and from the start of its next block, which reads
the save time its last block recorded).

``to_be_continued(step)`` then ends the stage with CONTINUE_EXIT: under a workflow it
is submitted again and resumes from its checkpoint in the next block.

A sweep that cuts a trial asks it to stop through the same agreement: at each rung the
stage's rank 0 waits for the sweep's ruling (``await_ruling``: ``stagedir.RULING`` in its
stage directory), and looks for a cut at most every STOP_POLL_S between rungs; the ranks
agree on a cut as on a block's end, and ``stop_requested()`` then tells the stage to save
and end well rather than to be continued. A trial the sweep pauses stops the same way; when
it is promoted, its call is submitted again and resumes from that checkpoint (``promoted``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import time
from collections import deque
from dataclasses import replace
from typing import Any, NoReturn

from ..common import settings, stagedir
from ..common.blocks import CONTINUE_EXIT, deadline_from_env
from .dist import cleanup, exit_process
from .log import get_logger
from .ranks import get_rank, process_group, rank_state

#: how much more than two steps and a save a rank allows itself before the block's end
STOP_MARGIN = 1.25
#: calls whose spacing estimates a step (the median ignores the steps that also saved)
_CALLS_KEPT = 10
#: seconds between rank 0's looks for a sweep's cut between rungs (one stat of a file in its stage directory)
STOP_POLL_S = 1.0
#: the longest rank 0 waits at a rung for the sweep's ruling (a sweep that is gone: the stage goes on)
RULING_WAIT_S = 60.0
#: what the ranks agree on (the largest view wins: a stop ends the stage whatever the block does)
_GO, _BLOCK_ENDS, _STOP = 0, 1, 2


def _stage_record() -> stagedir.ContinuationRecord | None:
    """This stage call's continuation record (rank 0 keeps it in the stage's directory); None
    when there is none, or when it was left by another call of the stage."""
    stage_dir = settings.STAGE_DIR.get()
    if not stage_dir:
        return None
    record = stagedir.read_or_none(os.path.join(stage_dir, stagedir.CONTINUATION), stagedir.ContinuationRecord,
                                   get_logger("parsl_torch"))
    return record if record is not None and record.call == settings.CALL_ID.get() else None


class _Agreement:
    """One rank's side of the ranks' agreement that the block is ending."""

    def __init__(self) -> None:
        self.deadline = deadline_from_env(os.environ)
        self.block_end = settings.BLOCK_END.get()
        last = _stage_record()
        #: the longest save of this block so far, starting from the last save of the call's previous block
        self.save_seconds = float(last.save_seconds) if last and last.save_seconds is not None else 0.0
        self._calls: deque[float] = deque(maxlen=_CALLS_KEPT)
        self._told = False
        self.signalled = False
        self.agreed = False
        self.reason = _GO  # what the ranks agreed on, once they did
        self.stopping = False  # rank 0 found a sweep's cut of this call
        #: the steps this attempt is known to have done (``progressed``, a rung): a cut applies from its step on
        self.reached = 0
        #: rank 0's rulings to look for (under a workflow only; the other ranks learn them by agreeing)
        self._ruling_file = _ruling_path() if get_rank() == 0 else None
        self._looked = 0.0
        self._group: Any = None
        self._pending: Any = None
        self._flag: Any = None
        self._handler_installed = False

    def _install_handler(self) -> None:
        """SIGUSR1 marks the block as ending (chained to a handler already there)."""
        self._handler_installed = True
        with contextlib.suppress(ValueError):  # not the main thread: the deadline alone decides
            previous = signal.getsignal(signal.SIGUSR1)

            def on_signal(signum: int, frame: Any) -> None:
                self.signalled = True
                if callable(previous):
                    previous(signum, frame)

            signal.signal(signal.SIGUSR1, on_signal)

    def step_seconds(self) -> float:
        """A step's duration: the median spacing of the last calls (0 before two calls)."""
        calls = list(self._calls)
        return statistics.median(b - a for a, b in zip(calls, calls[1:])) if len(calls) > 1 else 0.0

    def stop_time(self) -> float | None:
        """Epoch seconds from which to stop: the deadline, or earlier when two steps and the
        longest save (with a margin) need more than the grace period before the block's end."""
        if self.deadline is None or self.block_end is None:
            return self.deadline
        step = self.step_seconds()
        needed = STOP_MARGIN * (2 * step + self.save_seconds)
        stop = min(self.deadline, self.block_end - needed)
        if stop < self.deadline and not self._told:
            self._told = True
            if get_rank() == 0:
                get_logger("parsl_torch").warning(
                    "stopping %.0f s before the block's end, not the grace period's %.0f s: a checkpoint takes "
                    "%.1f s and a step %.1f s (the ranks stop one step after they agree); raise the site's "
                    "provider.grace_period to at least %.0f s", needed, self.block_end - self.deadline,
                    self.save_seconds, step, needed)
        return stop

    def local_view(self) -> int:
        if self._ruling_file and not self.stopping and time.monotonic() - self._looked >= STOP_POLL_S:
            self._looked = time.monotonic()
            self.stopping = _cuts(_ruling(self._ruling_file), self.reached)
        if self.stopping:
            return _STOP
        if self.signalled:
            return _BLOCK_ENDS
        stop = self.stop_time()
        return _BLOCK_ENDS if stop is not None and time.time() >= stop else _GO

    def ask(self) -> bool:
        if not self._handler_installed:
            self._install_handler()
        self._calls.append(time.monotonic())
        if self.agreed:
            return True  # every rank got True at the same call and stopped asking the others
        d = process_group()
        if d is None or d.get_world_size() == 1:
            self.reason = self.local_view()
            self.agreed = self.reason != _GO
            return self.agreed
        import torch

        if self._group is None:  # collective: the first call is at the same point on every rank
            self._group = d.new_group(backend="gloo")
            rank_state().before_cleanup.append(self.release)
        if self._pending is not None:
            self._pending.wait()
            self.reason = int(self._flag.item())
            self.agreed = self.reason != _GO
            self._pending = None
        if not self.agreed:
            self._flag = torch.tensor([self.local_view()], dtype=torch.int32)
            self._pending = d.all_reduce(self._flag, op=d.ReduceOp.MAX, group=self._group, async_op=True)
        return self.agreed

    def release(self) -> None:
        """Before the process group goes away: wait for the reduction in flight and forget the
        group (a later process group gets its own)."""
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
        self._group = None
        rank_state().before_cleanup.remove(self.release)


def _state() -> _Agreement:
    state = rank_state()
    if state.deadline is None:
        state.deadline = _Agreement()
    return state.deadline


def should_checkpoint() -> bool:
    """True once this stage's block is about to end: checkpoint now, then ``to_be_continued(step)``.

    Collective: call it at the same point on every rank (e.g. once per step). Every rank
    gets the same answer at the same call; it costs a background all-reduce of one
    integer, not a wait. Without a known block end (no workflow block, no ``launch
    --deadline``) it is always False."""
    return _state().ask()


def stop_requested() -> bool:
    """After ``should_checkpoint()`` said True: whether the ranks agreed to stop for a sweep's cut (save,
    then end as a finished stage whose result says where it stopped) rather than for the block's end
    (save, then ``to_be_continued``). The same answer on every rank."""
    return _state().reason == _STOP


def sweep_rungs() -> frozenset[int]:
    """The steps at which a sweep judges this call (``stages.sweep`` leaves them in its stage directory):
    a stage syncs its history there, so that the sweep reads the rung at once. Every rank reads the same
    file, so all sync at the same steps."""
    record = _rungs()
    return frozenset(record.steps) if record else frozenset()


def _rungs() -> stagedir.RungsRecord | None:
    """The sweep's rungs for this call (None: not a sweep's trial)."""
    stage_dir = settings.STAGE_DIR.raw()
    return stagedir.read_or_none(os.path.join(stage_dir, stagedir.RUNGS), stagedir.RungsRecord) if stage_dir else None


def await_ruling(step: int) -> None:
    """At a rung (``sweep_rungs``), after the history is on disk: rank 0 waits for the sweep's ruling on
    ``step`` (at most RULING_WAIT_S); a cut is agreed on at the next ``should_checkpoint()``. The other
    ranks go on: they wait in the next collective."""
    state = _state()
    if state._ruling_file is None:
        return
    state.reached = max(state.reached, step)
    waited, pause = time.monotonic(), 0.01
    longest = (_rungs() or stagedir.RungsRecord([])).poll_s  # (the sweep's own looks: none come sooner)
    while (ruling := _ruling(state._ruling_file)) is None or ruling.step < step:
        if time.monotonic() - waited > RULING_WAIT_S:
            get_logger("parsl_torch").warning("no ruling of the sweep at step %d within %.0f s: going on "
                                              "(is the workflow that runs the sweep gone?)", step, RULING_WAIT_S)
            return
        time.sleep(pause)
        pause = min(2 * pause, longest)
    state.stopping = _cuts(ruling, state.reached)


def progressed(steps: int) -> None:
    """A sweep's trial has done ``steps`` steps in this attempt or before it (a resumed one: past the rungs it
    was judged at): a cut at a rung up to there applies at once."""
    state = _state()
    state.reached = max(state.reached, steps)


def _cuts(ruling: stagedir.RulingRecord | None, reached: int) -> bool:
    """Whether ``ruling`` stops an attempt that has done ``reached`` steps: a cut at a rung it reached. (An
    attempt that started again from scratch waits for its rung: the sweep may have judged that rung from the
    history a killed attempt of the same call left, and the trial then stops where the judged one was.)"""
    return ruling is not None and not ruling.keep and ruling.step <= reached


def promoted() -> bool:
    """Whether the sweep's last ruling on this call lets it go on: a trial paused at a rung and promoted since
    resumes from the checkpoint it stopped at, where a cut one would end there again. Every rank reads it (the
    sweep wrote it before it submitted the call again, and writes no other until the next rung)."""
    path = _ruling_path()
    ruling = _ruling(path) if path else None
    return ruling is not None and ruling.keep


def _ruling_path() -> str | None:
    """Where the sweep leaves its rulings on this call (None: not under a workflow)."""
    stage_dir = settings.STAGE_DIR.raw()
    return os.path.join(stage_dir, stagedir.RULING) if stage_dir else None


def _ruling(path: str) -> stagedir.RulingRecord | None:
    """The sweep's last ruling on this call (None: none yet, or one on another call of the stage)."""
    record = stagedir.read_or_none(path, stagedir.RulingRecord, get_logger("parsl_torch"))
    return record if record is not None and record.call == settings.CALL_ID.raw() else None


def deadline() -> float | None:
    """Epoch seconds from which this stage should checkpoint and stop (None: no block end known);
    earlier than the block's end less the grace period when this stage's saves need more."""
    return _state().stop_time()


def _record(fields: dict[str, Any]) -> None:
    """Rank 0 leaves the stage's record beside its files, for the workflow (under a workflow only)."""
    stage_dir = settings.STAGE_DIR.raw()
    if get_rank() != 0 or not stage_dir or not os.path.isdir(stage_dir):
        return
    record = _stage_record() or stagedir.ContinuationRecord(settings.CALL_ID.get(), time.time())
    stagedir.write(os.path.join(stage_dir, stagedir.CONTINUATION), replace(record, **fields, time=time.time()))


def note_checkpoint(step: int, seconds: float) -> None:
    """After a checkpoint of ``step`` that took ``seconds``: record the progress, and warn when
    the save is longer than the grace period (the block would end in the middle of one).
    Later stops come early enough for a save that long (see ``stop_time``)."""
    state = _state()
    state.save_seconds = max(state.save_seconds, seconds)
    grace = settings.GRACE.get()
    if grace and seconds > grace and get_rank() == 0:
        get_logger("parsl_torch").warning(
            "the checkpoint of step %d took %.0f s, longer than the grace period of %.0f s: a block may end "
            "before the last save is written; raise the site's provider.grace_period (or the walltime)",
            step, seconds, grace)
    _record({"step": step, "save_seconds": round(seconds, 3), "grace": grace or None})


def to_be_continued(step: int | None = None) -> NoReturn:
    """End this rank: the stage stopped for its block's end and continues in the next one.

    Call it on every rank after saving a checkpoint to resume from. ``step``: how far the
    stage got (a stage that reports no more progress than last time counts toward the
    workflow's ``max_continuations``). Exits with CONTINUE_EXIT."""
    _record({"step": step} if step is not None else {})
    cleanup()
    exit_process(CONTINUE_EXIT)
