"""The workflow's side of a running sweep: it looks at the trials five times a second (through an endpoint:
every few seconds, ``trialfiles``), judges each at the rungs its history reached (``asha``), leaves the
ruling for its rank 0, and records each trial's end in the sweep's journal (``journal``). Under
``asha-promote`` a trial that does not go on is paused (its stage ends well at the rung, its slot freed)
and promoted when it ranks (``promote``: the ruling that keeps it and its finished call's record removed,
then ``stages.sweep`` submits the same call again). ``stages.sweep`` starts the trials."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...common import stagedir
from .asha import Asha, Decision, Promotions
from .journal import SweepRecord
from .trialfiles import Ask, EndpointFiles, LocalFiles, Peek, rung_value

#: seconds each of the last two tasks of a stopped sweep may take through an endpoint (Ctrl-C waits for them)
LET_GO_S = 10.0


@dataclass
class Trial:
    """One configuration of a sweep: its stage, its state (finished, stopped, failed), where it got, its
    decisions, and its stage's result (the train stage's: final_loss, stopped_at, ...)."""

    name: str
    config: dict[str, Any]
    state: str
    step: int | None
    decisions: list[Decision]
    result: Any
    value: float | None  # finished: the metric over its last ``window`` steps (how the finished rank)
    why: str = ""


#: what a sweep's ``more()`` answers when the sampler's every trial was asked (or nothing is left to start)
ASKED_ALL = object()
#: what it answers when nothing can start now (a later look may find a trial to promote)
NOTHING_NOW = object()


@dataclass
class Run:
    stage: str
    stage_dir: Path
    future: Any
    read_at: float | None = None  # the mtime of its history when it was last read
    submitted: float = field(default_factory=time.time)


class Watch:
    """The workflow's side of a sweep: judges running trials at their rungs, stops the cut ones, and
    keeps the record."""

    def __init__(self, name: str, rules: dict[str, Any], record: SweepRecord, log: Any,
                 on_end: Callable[[str], None] | None = None, files: LocalFiles | EndpointFiles | None = None) -> None:
        self.name, self.rules, self.record, self.log = name, rules, record, log
        self.on_end = on_end  # told each trial's end (a sampler)
        self.files = files or LocalFiles()  # where the trials' directories are read and written (trialfiles)
        self.asha = Asha(rules["eta"], rules["mode"], promoting=rules["scheduler"] == "asha-promote")
        #: the paused trials (``asha-promote``), None: trials that do not go on stop
        self.promotions = Promotions(self.asha) if rules["scheduler"] == "asha-promote" else None
        self.again: list[str] = []  # promoted trials to submit again at once (``_record_end``)
        self._replay()

    def _replay(self) -> None:
        """The values seen at each rung: the decisions so far, in their order."""
        self.asha.seen = {}
        for stage, rung in self.record.order:
            self.asha.see(rung, next(d["value"] for d in self.record.trials[stage].decisions if d["rung"] == rung))

    def until_done(self, runs: list[Run], more: Callable[[int], Any] | None = None, concurrent: int = 0) -> None:
        """Until every trial ended; ``more(running)`` starts the next (None: ask again; NOTHING_NOW: nothing
        can start now; ASKED_ALL: nothing more will), while fewer than ``concurrent`` run."""
        waiting, ended = list(runs), threading.Event()  # (a trial's end wakes the watch: its slot takes the next)
        for run in waiting:
            _wakes(run, ended)
        try:
            while waiting or more is not None:
                ended.clear()
                waiting = self.look(waiting)
                while more is not None and len(waiting) < concurrent:
                    started = more(len(waiting))
                    if started is ASKED_ALL:
                        more = None
                    elif started is NOTHING_NOW:
                        break
                    elif started is not None:
                        _wakes(started, ended)
                        waiting.append(started)
                if waiting or more is not None:
                    ended.wait(self.files.poll_s)
        except BaseException:  # (Ctrl-C, SIGTERM, an error): the trials still running wait at no more rungs
            self._let_go([run for run in waiting if self.record.trials[run.stage].alive])
            raise

    def _let_go(self, runs: list[Run]) -> None:
        """A ruling that lets each run go on past every rung (a cut one stops as decided)."""
        with contextlib.suppress(Exception):  # (best effort: the error being raised is the one to see)
            peeks = self.files.peek([Ask(str(run.stage_dir), None, True, (), history=False) for run in runs],
                                    self.rules["metric"], self.rules["window"], timeout=LET_GO_S)
            self.files.put([(run.stage_dir / stagedir.RULING, stagedir.RulingRecord(
                peek.call, time.time(), self.rules["steps"], True, "the sweep stopped watching: going on"))
                for run, peek in zip(runs, peeks)], timeout=LET_GO_S)

    def look(self, waiting: list[Run]) -> list[Run]:
        """One look at the trials not done: the finished ones recorded, the running ones judged where they
        reached a rung; those still to finish. Their directories are read in one go (one task through an
        endpoint), then each is taken in its order."""
        ended = {id(run) for run in waiting if run.future.done()}
        running = [run for run in waiting if id(run) not in ended and self.rules["rungs"] and _launched(run.future)]
        ok = [run for run in waiting if id(run) in ended and _ended_well(run.future)]  # (a failed one is not read)
        asks = [*self._asks(ok, final=True), *self._asks(running, final=False)]
        peeks = dict(zip(map(id, ok + running), self.files.peek(asks, self.rules["metric"], self.rules["window"])))
        left = []
        for run in waiting:
            if id(run) in ended:
                self._finished(run, peeks.get(id(run)))
            else:
                left.append(run)
                if id(run) in peeks:
                    self._judge(run, peeks[id(run)], final=False)
        return left

    def _asks(self, runs: list[Run], final: bool) -> list[Ask]:
        """What to read in each run's directory: its history, at the rungs it was not judged at yet."""
        return [Ask(str(run.stage_dir), run.read_at, final,
                    tuple(self.rules["rungs"][len(self.record.trials[run.stage].decisions):])) for run in runs]

    def _judge(self, run: Run, peek: Peek, final: bool) -> None:
        """Judge ``run`` at each rung its history reached and it was not judged at yet."""
        t = self.record.trials[run.stage]
        if not peek.read:
            return  # its history did not change since the last look (it changes at each rung)
        if not final and (peek.call is None or peek.owner != peek.call):
            return  # its attempt has not started (an earlier call's files may still be there)
        if self.record.forget_other_call(run.stage, peek.call):
            self._replay()
        if not t.alive:
            return
        run.read_at = peek.mtime
        if peek.steps is None:
            return
        if not final:
            self.record.update(run.stage, state="running")
        done = len(t.decisions)
        for rung, at in enumerate(self.rules["rungs"][done:], start=done):
            if peek.steps < at:
                return
            value = rung_value(peek.values, at, self.rules["window"])
            d = self.asha.judge(run.stage, rung, value)
            self.record.decide(vars(d), peek.call)
            self.log.info("sweep %r: %s at rung %d (step %d): %s=%.4g, cut %.4g: %s", self.name, run.stage, rung,
                          at, self.rules["metric"], value, d.cut,
                          "goes on" if d.keep else "paused" if self._pauses(d) else "stopped")
            if not final:
                self._ruling(run, d, at)
            if not d.keep:
                return

    def _ruling(self, run: Run, d: Decision, at: int) -> None:
        """The decision (in the journal already), for the trial's rank 0: it waits for it at the rung."""
        why = "" if d.keep else f"{'paused' if self._pauses(d) else 'cut'} at {self._says(d)}"
        self.record.update(run.stage, why=why)
        ruling = stagedir.RulingRecord(self.record.trials[run.stage].call, time.time(), at, d.keep, why)
        self.files.put([(run.stage_dir / stagedir.RULING, ruling)])

    def _pauses(self, d: Decision | dict[str, Any]) -> bool:
        """Whether a trial that does not go on at a rung waits there (``asha-promote``; a value that is not a
        number never ranks: it stops)."""
        d = d if isinstance(d, Decision) else Decision(**d)
        return self.promotions is not None and not d.keep and math.isfinite(d.value)

    def promote(self, stage: str, stage_dir: Path) -> None:
        """The paused trial ``stage`` goes on; the caller submits it. In this order, so that a kill between two
        steps leaves no promotion half made: a ruling that keeps it at its rung (alone, it changes nothing: its
        finished call's record stands), the journal's line, then that record removed (its call runs again and
        resumes from its checkpoint)."""
        rung = self.promotions.paused.pop(stage)[0]
        why = self._promoted(stage, stage_dir, rung)
        self.record.promote(stage, rung)
        self.files.put([(stage_dir / stagedir.CALL, None)])
        self.log.info("sweep %r: %s %s", self.name, stage, why)

    def _promoted(self, stage: str, stage_dir: Path, rung: int) -> str:
        """The ruling that lets ``stage`` go on from ``rung``, left in its directory; what it says."""
        t = self.record.trials[stage]
        value = next(d for d in t.decisions if d["rung"] == rung)["value"]
        now = self.asha.cut(rung) * (1 if self.rules["mode"] == "min" else -1)
        why = f"promoted from rung {rung} (step {self.rules['rungs'][rung]}): {value:.4g} is within its cut now, {now:.4g}"
        ruling = stagedir.RulingRecord(t.call, time.time(), self.rules["rungs"][rung], True, why, promoted=True)
        self.files.put([(stage_dir / stagedir.RULING, ruling)])
        return why

    def stop_paused(self) -> None:
        """At the sweep's end: the trials still paused stop at their rungs."""
        for stage in list(self.promotions.paused if self.promotions else ()):
            self.promotions.paused.pop(stage)
            t = self.record.trials[stage]
            self.record.update(stage, state="stopped", why=f"{t.why}; not promoted: stopped there")

    def _says(self, d: Decision) -> str:
        return d.says(self.rules["metric"], self.rules["mode"], self.rules["rungs"][d.rung])

    def _finished(self, run: Run, peek: Peek | None) -> None:
        self._record_end(run, peek)
        if self.on_end is not None:
            self.on_end(run.stage)

    def _record_end(self, run: Run, peek: Peek | None) -> None:
        """The trial's end in the journal; ``peek``: its directory read since it ended (None: it failed)."""
        t = self.record.trials[run.stage]
        self._busy(run)
        try:
            result = run.future.result()
        except Exception as exc:  # noqa: BLE001 (a failed trial is one result of the sweep; it says why)
            why = str(exc).splitlines()[0] if str(exc) else repr(exc)
            self.record.update(run.stage, state="failed", why=why, result=None)
            self.log.warning("sweep %r: %s failed: %s", self.name, run.stage, why)
            return
        assert peek is not None  # (read in the look that found it ended well)
        if self.rules["rungs"]:
            self._judge(run, peek, final=True)  # rungs passed before they were looked at (a fast or skipped trial)
        stopped = result.get("stopped_at") if isinstance(result, Mapping) else None
        if stopped is None and not t.alive and (peek.steps or 0) < self.rules["steps"]:
            stopped = peek.steps  # (a stage of your own, cut: where its history ends)
        if stopped is not None and t.promoted and t.decisions[-1]["rung"] == t.promoted[-1] and stopped == t.step:
            # promoted, yet its stage ended where it paused: the kill of an earlier run came between the journal's
            # line and the files (``promote``): they are made again, and it is submitted again
            self._promoted(run.stage, run.stage_dir, t.promoted[-1])
            self.files.put([(run.stage_dir / stagedir.CALL, None)])
            self.again.append(run.stage)
            return
        if stopped is not None and not t.alive and self._pauses(t.decisions[-1]):
            self.record.update(run.stage, state="paused", step=stopped, result=result,
                               why=f"paused at step {stopped} ({self._says(Decision(**t.decisions[-1]))})")
            self.promotions.paused[run.stage] = (t.decisions[-1]["rung"], t.decisions[-1]["value"])
            return
        if stopped is not None:
            why = f"stopped at step {stopped} ({self._says(Decision(**t.decisions[-1]))})" if t.decisions else ""
            self.record.update(run.stage, state="stopped", step=stopped, result=result, why=why)
            return
        why = "finished before its cut reached it" if not t.alive else ""
        self.record.update(run.stage, state="finished", step=self.rules["steps"], result=result, why=why,
                           value=rung_value(peek.values, peek.steps or 0, self.rules["window"]))

    def _busy(self, run: Run) -> None:
        """The slot-time the trial's attempt held (from its worker's start, ``stagedir.STARTED``, to its end as
        seen here; none for a skip), added to its record: how busy a sweep keeps its slots."""
        with contextlib.suppress(OSError):
            started = (run.stage_dir / stagedir.STARTED).stat().st_mtime if isinstance(self.files, LocalFiles) else 0
            if started >= run.submitted - 1.0:
                t = self.record.trials[run.stage]
                self.record.update(run.stage, busy_s=round((t.busy_s or 0.0) + time.time() - started, 3))

    def trial(self, stage: str) -> Trial:
        t = self.record.trials[stage]
        return Trial(stage, t.config, t.state, t.step, [Decision(**d) for d in t.decisions], t.result, t.value,
                     t.why)


def _wakes(run: Run, ended: threading.Event) -> None:
    """``ended`` set when the run's future is done (a future without callbacks: the next look finds it)."""
    if callable(add := getattr(run.future, "add_done_callback", None)):
        add(lambda _: ended.set())


def _ended_well(future: Any) -> bool:
    """A done trial's future holds its result (not an error, nor a cancellation)."""
    with contextlib.suppress(Exception):  # (cancelled: its record says why)
        return future.exception() is None
    return False


def _launched(future: Any) -> bool:
    """Whether Parsl handed the trial's task to its executor (one waiting for a slot costs no file look)."""
    status = getattr(getattr(future, "app_future", future), "task_status", None)
    return status is None or status() in ("launched", "running", "running_ended")
