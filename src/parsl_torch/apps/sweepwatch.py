"""The workflow's side of a running sweep: it looks at the trials five times a second, judges each at the
rungs its history reached (``asha``), leaves the verdict for its rank 0, and records each trial's end in
the sweep's journal (``sweeprecord``). ``stages.sweep`` starts the trials."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common import stagedir
from .asha import Asha, Decision
from .freshdir import owner
from .sweeprecord import SweepRecord

#: seconds between two looks at the running trials' histories
POLL_S = 0.2


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


#: what a sweep's ``more()`` answers when the sampler's every trial was asked
ASKED_ALL = object()


@dataclass
class Run:
    stage: str
    stage_dir: Path
    future: Any
    read_at: float | None = None  # the mtime of its history when it was last read


class Watch:
    """The workflow's side of a sweep: judges running trials at their rungs, stops the cut ones, and
    keeps the record."""

    def __init__(self, run_dir: Path, name: str, rules: dict[str, Any], record: SweepRecord, log: Any,
                 on_end: Callable[[str], None] | None = None) -> None:
        self.run_dir, self.name, self.rules, self.record, self.log = run_dir, name, rules, record, log
        self.on_end = on_end  # told each trial's end (a sampler)
        self.asha = Asha(rules["eta"], rules["mode"])
        self._replay()

    def _replay(self) -> None:
        """The values seen at each rung: the decisions so far, in their order."""
        self.asha.seen = {}
        for stage, rung in self.record.order:
            d = next(d for d in self.record.trials[stage].decisions if d["rung"] == rung)
            self.asha.see(rung, d["value"])

    def until_done(self, runs: list[Run], more: Callable[[], Any] | None = None, concurrent: int = 0) -> None:
        """Until every trial ended; ``more()`` starts the next (None: nothing new; ASKED_ALL: no more), while
        fewer than ``concurrent`` run."""
        waiting = list(runs)
        try:
            while waiting or more is not None:
                waiting = self.look(waiting)
                while more is not None and len(waiting) < concurrent:
                    started = more()
                    if started is ASKED_ALL:
                        more = None
                    elif started is not None:
                        waiting.append(started)
                if waiting:
                    time.sleep(POLL_S)
        except BaseException:  # (Ctrl-C, SIGTERM, an error): the trials still running wait at no more rungs
            for run in waiting:
                call = _call(run.stage_dir)
                if any(not d["keep"] for d in self.record.trials[run.stage].decisions):
                    continue  # (cut: it stops)
                with contextlib.suppress(OSError):
                    stagedir.write(run.stage_dir / stagedir.VERDICT, stagedir.VerdictRecord(
                        call, time.time(), self.rules["steps"], True, "the sweep stopped watching: going on"))
            raise

    def look(self, waiting: list[Run]) -> list[Run]:
        """One look at the trials not done: the finished ones recorded, the running ones judged where they
        reached a rung; those still to finish."""
        left = []
        for run in waiting:
            if run.future.done():
                self._finished(run)
            else:
                left.append(run)
                if self.rules["rungs"] and _launched(run.future):
                    self._judge(run, final=False)
        return left

    def _judge(self, run: Run, final: bool) -> None:
        """Judge ``run`` at each rung its history reached and it was not judged at yet."""
        t = self.record.trials[run.stage]
        files = _histories(run.stage_dir, final)
        if not final and (not files or files[0][0] == run.read_at):
            return  # its history did not change since the last look (it changes at each rung)
        call = _call(run.stage_dir)
        if not final and (call is None or owner(run.stage_dir) != call):
            return  # its attempt has not started (an earlier call's files may still be there)
        if self.record.forget_other_call(run.stage, call):
            self._replay()
        if any(not d["keep"] for d in t.decisions):
            return
        run.read_at = files[0][0] if files else None
        steps_done, values = _history(files, self.rules["metric"])
        if steps_done is None:
            return
        if not final:
            self.record.update(run.stage, state="running")
        done = len(t.decisions)
        for rung, at in enumerate(self.rules["rungs"][done:], start=done):
            if steps_done < at:
                return
            value = _rung_value(values, at, self.rules["window"])
            d = self.asha.judge(run.stage, rung, value)
            self.record.decide(vars(d), call)
            self.log.info("sweep %r: %s at rung %d (step %d): %s=%.4g, cut %.4g: %s", self.name, run.stage, rung,
                          at, self.rules["metric"], value, d.cut, "goes on" if d.keep else "stopped")
            if not final:
                self._verdict(run, d, at)
            if not d.keep:
                return

    def _verdict(self, run: Run, d: Decision, at: int) -> None:
        """The decision (in the journal already), for the trial's rank 0: it waits for it at the rung."""
        why = "" if d.keep else f"cut at {self._says(d)}"
        self.record.update(run.stage, why=why)
        verdict = stagedir.VerdictRecord(self.record.trials[run.stage].call, time.time(), at, d.keep, why)
        stagedir.write(run.stage_dir / stagedir.VERDICT, verdict)

    def _says(self, d: Decision) -> str:
        return d.says(self.rules["metric"], self.rules["mode"], self.rules["rungs"][d.rung])

    def _finished(self, run: Run) -> None:
        self._record_end(run)
        if self.on_end is not None:
            self.on_end(run.stage)

    def _record_end(self, run: Run) -> None:
        t = self.record.trials[run.stage]
        try:
            result = run.future.result()
        except Exception as exc:  # noqa: BLE001 (a failed trial is one result of the sweep; it says why)
            why = str(exc).splitlines()[0] if str(exc) else repr(exc)
            self.record.update(run.stage, state="failed", why=why, result=None)
            self.log.warning("sweep %r: %s failed: %s", self.name, run.stage, why)
            return
        if self.rules["rungs"]:
            self._judge(run, final=True)  # rungs passed before they were looked at (a fast or skipped trial)
        stopped = result.get("stopped_at") if isinstance(result, Mapping) else None
        if stopped is not None:
            why = f"stopped at step {stopped} ({self._says(Decision(**t.decisions[-1]))})" if t.decisions else ""
            self.record.update(run.stage, state="stopped", step=stopped, result=result, why=why)
            return
        steps_done, values = _history(_histories(run.stage_dir, final=True), self.rules["metric"])
        why = "finished before its cut reached it" if any(not d["keep"] for d in t.decisions) else ""
        self.record.update(run.stage, state="finished", step=self.rules["steps"], result=result, why=why,
                           value=_rung_value(values, steps_done or 0, self.rules["window"]))

    def trial(self, stage: str) -> Trial:
        t = self.record.trials[stage]
        return Trial(stage, t.config, t.state, t.step, [Decision(**d) for d in t.decisions], t.result, t.value,
                     t.why)


def _launched(future: Any) -> bool:
    """Whether Parsl handed the trial's task to its executor (one waiting for a slot costs no file look)."""
    status = getattr(getattr(future, "app_future", future), "task_status", None)
    return status is None or status() in ("launched", "running", "running_ended")


def _call(stage_dir: Path) -> str | None:
    record = stagedir.read_or_none(stage_dir / stagedir.IDENTITY, stagedir.IdentityRecord)
    return record.call_id if record else None


def _histories(stage_dir: Path, final: bool) -> list[tuple[float, Path]]:
    """The trial's history files, newest first (the partial one while it runs), with their mtimes."""
    found = []
    for path in stage_dir.glob("*.h5" if final else "*.h5*"):
        if path.suffix in (".h5", ".partial"):
            try:
                found.append((path.stat().st_mtime, path))
            except FileNotFoundError:  # (the partial file moved into place as it was listed)
                continue
    return sorted(found, reverse=True)


def _history(files: list[tuple[float, Path]], metric: str) -> tuple[int | None, dict[int, float]]:
    """(steps the newest history holds, step -> metric: the mean over ranks where recorded)."""
    import h5py

    from ..history.h5file import dataset_name

    for _, path in files:
        try:
            with h5py.File(path, "r", locking=False) as f:
                name = dataset_name(metric)
                name = f"{name}_mean" if f"{name}_mean" in f else name
                if name not in f:
                    continue
                steps, values = f["step"][:], f[name][:]
        except (OSError, KeyError):
            continue  # (replaced as it was opened: read at the next look)
        return (int(steps.max()) + 1 if len(steps) else 0), dict(zip(steps.tolist(), values.tolist()))
    return None, {}


def _rung_value(values: dict[int, float], at: int, window: int) -> float:
    got = [values[s] for s in range(at - window, at) if s in values and math.isfinite(values[s])]
    return sum(got) / len(got) if len(got) == window else math.nan
