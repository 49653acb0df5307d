"""``pt.sweep``: trials of a space of configurations, poor ones stopped early (ASHA) from their live histories.

Every trial is submitted at once (Parsl runs them as slots free up, packed as any stages). The workflow
process watches each running trial's history: the trial's stage syncs its history to its file at each
rung (the steps are left in its directory, ``stagedir.RUNGS``), the sweep reads the rung's metric (the
mean of its last ``window`` steps, over the ranks) and judges it (``asha``); a trial that is cut gets a
verdict in its directory (``stagedir.VERDICT``), for which its rank 0 waits at the rung; its ranks
agree on a cut at the next step (``core.deadline``), save their checkpoint and end as a finished stage
whose result says where.

The decisions are kept in ``<run_dir>/.sweep.<name>.jsonl`` (``apps.sweeprecord``), with the call each
was made on: a rerun submits every trial again, and the memoizer (the one place where a stage skips)
skips the finished and stopped ones; a trial killed while running resumes from its checkpoint and its
decisions made so far stand; a trial whose call changed (its code, config or inputs) is judged again.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common import stagedir
from ..core.log import get_logger
from ..apps.asha import MODES, Asha, Decision, rung_steps
from ..apps.freshdir import owner
from ..apps.rundir import check_stage_name
from ..apps.sweeprecord import SweepRecord
from ..apps.sweepspace import expand, trial_name
from ..apps.sweepview import best_first, figure, table
from ..apps.workflow import current_workflow
from ..errors import ConfigError
from .config import load_config

SCHEDULERS = ("asha", "none")
#: seconds between two looks at the running trials' histories
POLL_S = 0.2
#: what the built-in train stage records (a metric it does not is refused before any trial starts)
TRAIN_METRICS = ("loss", "lr", "dt", "tokens_per_s", "tflops", "mfu")


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


def sweep(space: Any, *, steps: int, metric: str = "loss", mode: str = "min", scheduler: str = "asha",
          min_steps: int | None = None, eta: int = 3, window: int | None = None,
          trial: Callable[..., Any] | None = None, base: Mapping[str, Any] | str | os.PathLike | None = None,
          name: str = "sweep", **call: Any) -> list[Trial]:
    """Run a trial per configuration of ``space`` (a list of configurations, or a mapping of lists: their
    grid; over ``base``), each for ``steps`` steps; with ``scheduler="asha"`` a trial is judged on
    ``metric`` (``mode`` min or max) at ``min_steps * eta**k`` steps and stopped unless it is in the best
    ``1/eta`` of the trials judged there before it. ``trial(config, stage=...)`` submits the trial's
    stage and returns its future (default: the built-in train; a stage of your own must record
    ``metric`` in its history and call ``pt.should_checkpoint()`` each step to be stoppable). Other
    keyword arguments go to each trial's stage call (``ranks_per_node=1``, ``num_nodes``, ``site``...).
    Returns the trials, best first (finished by their final value, then stopped ones by the rungs
    they passed)."""
    if not isinstance(name, str) or len(name) > 90:
        raise ConfigError(f"pt.sweep(name={name!r}): a name of at most 90 letters, digits, '.', '_' or '-'")
    check_stage_name(f"{name}-00000000", explicit=True)  # (its trials' stages: NAME-<digest>)
    rules = _rules(steps, metric, mode, scheduler, min_steps, eta, window)
    configs = [{**c, "steps": steps} if trial is None else c for c in expand(space, _base(base))]
    if trial is None:
        _check_train(configs, metric, name)
    elif not callable(trial):
        raise ConfigError(f"pt.sweep(trial={trial!r}): give a function (config, stage=...) -> a stage's future")
    wf = current_workflow(name)
    # submitted in the order of their names (digests: a fixed shuffle), so that a space listed from poor to
    # good does not reach each rung best-last, where every trial would be the best so far and go on
    placed = {trial_name(name, c): (c, _stage_dir(wf, trial_name(name, c), call.get("site"), bool(rules["rungs"])))
              for c in sorted(configs, key=lambda c: trial_name(name, c))}
    log = get_logger("parsl_torch.workflow")
    record = SweepRecord.open(wf.run_dir, name, rules, log)
    record.keep_only(set(placed))
    runs = []
    for stage, (config, stage_dir) in placed.items():  # (everything checked: now the trials start)
        record.add(stage, config)
        if rules["rungs"]:
            stage_dir.mkdir(parents=True, exist_ok=True)
            stagedir.write(stage_dir / stagedir.RUNGS, stagedir.RungsRecord(rules["rungs"]))
        runs.append(_Run(stage, stage_dir, (trial or _train)(config, stage=stage, **call)))
    log.info("sweep %r: %d trial(s), %s", name, len(runs), _describe(rules))
    watch = _Watch(wf.run_dir, name, rules, record, log)
    watch.until_done(runs)
    saved = record.as_dict()
    log.info("%s\nfigure: %s", table(wf.run_dir, name, saved), figure(wf.run_dir, name, saved))
    if all(t["state"] == "failed" for t in saved["trials"].values()):
        runs[0].future.result()  # every trial failed: the first one's error is the sweep's
    return [watch.trial(stage) for stage in best_first(saved)]


def _rules(steps: int, metric: str, mode: str, scheduler: str, min_steps: int | None, eta: int,
           window: int | None) -> dict[str, Any]:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"pt.sweep(steps={steps!r}): the budget of a trial, an int >= 1")
    if scheduler not in SCHEDULERS:
        raise ConfigError(f"pt.sweep(scheduler={scheduler!r}): use one of {', '.join(SCHEDULERS)}")
    if mode not in MODES:
        raise ConfigError(f"pt.sweep(mode={mode!r}): use 'min' (a loss) or 'max' (an accuracy)")
    if not isinstance(metric, str) or not metric:
        raise ConfigError(f"pt.sweep(metric={metric!r}): name a metric the trial's history records ('loss')")
    if isinstance(eta, bool) or not isinstance(eta, int) or eta < 2:
        raise ConfigError(f"pt.sweep(eta={eta!r}): use an int >= 2 (each rung keeps the best 1/eta)")
    if min_steps is None:
        min_steps = max(1, steps // eta ** 3)
    rungs = rung_steps(min_steps, eta, steps) if scheduler == "asha" else []
    window = max(1, min_steps // 2) if window is None else window
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= min_steps:
        raise ConfigError(f"pt.sweep(window={window!r}): the steps averaged at a rung, an int from 1 to "
                          f"min_steps ({min_steps})")
    return {"scheduler": scheduler, "metric": metric, "mode": mode, "steps": steps, "eta": eta,
            "rungs": rungs, "window": window}


def _base(base: Mapping[str, Any] | str | os.PathLike | None) -> Mapping[str, Any]:
    """The settings every trial shares: a mapping, or a YAML file of them."""
    if base is None or isinstance(base, Mapping):
        return base or {}
    import yaml

    try:
        loaded = yaml.safe_load(Path(base).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"pt.sweep(base={str(base)!r}): {exc}: give a YAML file of settings or a mapping") from None
    if not isinstance(loaded, Mapping):
        raise ConfigError(f"pt.sweep(base={str(base)!r}): the file holds {type(loaded).__name__}, not a mapping")
    return loaded


def _describe(rules: dict[str, Any]) -> str:
    if not rules["rungs"]:
        return f"every one to step {rules['steps']} (scheduler='none')"
    return (f"judged on {rules['metric']} ({rules['mode']}) at steps {', '.join(map(str, rules['rungs']))}; "
            f"the best 1/{rules['eta']} at each go on")


def _check_train(configs: list[dict[str, Any]], metric: str, name: str) -> None:
    """Every configuration checked as the train stage will, before any trial is submitted."""
    from .train import TrainConfig

    if metric not in TRAIN_METRICS:
        raise ConfigError(f"pt.sweep(metric={metric!r}): the train stage records {', '.join(TRAIN_METRICS)}")
    for config in configs:
        load_config(config, TrainConfig, trial_name(name, config))


def _train(config: dict[str, Any], stage: str, **call: Any) -> Any:
    from .train import train

    return train(config, stage=stage, **call)


def _stage_dir(wf: Any, stage: str, site: str | None, judged: bool) -> Path:
    placement = wf.placement(stage, site)
    if judged and placement.remote:
        raise ConfigError(f"pt.sweep: site {placement.site.name!r} runs stages on a Globus Compute endpoint, "
                          f"whose files this process cannot read while a trial runs: use scheduler='none' "
                          f"there, or a site of this machine's")
    return placement.stage_dir(wf.run_dir, stage)


@dataclass
class _Run:
    stage: str
    stage_dir: Path
    future: Any
    read_at: float | None = None  # the mtime of its history when it was last read


class _Watch:
    """The workflow's side of a sweep: judges running trials at their rungs, stops the cut ones, and
    keeps the record."""

    def __init__(self, run_dir: Path, name: str, rules: dict[str, Any], record: SweepRecord, log: Any) -> None:
        self.run_dir, self.name, self.rules, self.record, self.log = run_dir, name, rules, record, log
        self.asha = Asha(rules["eta"], rules["mode"])
        self._replay()

    def _replay(self) -> None:
        """The values seen at each rung: the decisions so far, in their order."""
        self.asha.seen = {}
        for stage, rung in self.record.order:
            d = next(d for d in self.record.trials[stage].decisions if d["rung"] == rung)
            self.asha.see(rung, d["value"])

    def until_done(self, runs: list[_Run]) -> None:
        waiting = list(runs)
        try:
            while waiting:
                waiting = self.look(waiting)
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

    def look(self, waiting: list[_Run]) -> list[_Run]:
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

    def _judge(self, run: _Run, final: bool) -> None:
        """Judge ``run`` at each rung its history reached and it was not judged at yet."""
        t = self.record.trials[run.stage]
        call = _call(run.stage_dir)
        if not final and (call is None or owner(run.stage_dir) != call):
            return  # its attempt has not started (an earlier call's files may still be there)
        if self.record.forget_other_call(run.stage, call):
            self._replay()
        if any(not d["keep"] for d in t.decisions):
            return
        files = _histories(run.stage_dir, final)
        if not final and (not files or files[0][0] == run.read_at):
            return  # its history did not change since the last look (it changes at each rung)
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

    def _verdict(self, run: _Run, d: Decision, at: int) -> None:
        """The decision (in the journal already), for the trial's rank 0: it waits for it at the rung."""
        why = "" if d.keep else f"cut at {self._says(d)}"
        self.record.update(run.stage, why=why)
        verdict = stagedir.VerdictRecord(self.record.trials[run.stage].call, time.time(), at, d.keep, why)
        stagedir.write(run.stage_dir / stagedir.VERDICT, verdict)

    def _says(self, d: Decision) -> str:
        return d.says(self.rules["metric"], self.rules["mode"], self.rules["rungs"][d.rung])

    def _finished(self, run: _Run) -> None:
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
