"""``pt.sweep``: trials of a space of configurations, poor ones stopped early (ASHA) from their live histories.

Every trial is submitted at once (Parsl runs them as slots free up, packed as any stages); under
``asha-promote`` the sweep keeps ``slots`` of them running itself, so that a free slot takes a paused
trial that ranks now before any new one (``_Queue``). The workflow
process watches each running trial's history: the trial's stage syncs its history to its file at each
rung (the steps are left in its directory, ``stagedir.RUNGS``), the sweep reads the rung's metric (the
mean of its last ``window`` steps, over the ranks) and judges it (``asha``); a trial that is cut gets a
ruling in its directory (``stagedir.RULING``), for which its rank 0 waits at the rung; its ranks
agree on a cut at the next step (``core.deadline``), save their checkpoint and end as a finished stage
whose result says where.

The decisions are kept in ``<run_dir>/.sweep.<name>.jsonl`` (``apps.sweeps.journal``), with the call each
was made on: a rerun submits every trial again, and the memoizer (the one place where a stage skips)
skips the finished and stopped ones; a trial killed while running resumes from its checkpoint and its
decisions made so far stand; a trial whose call changed (its code, config or inputs) is judged again.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..apps.sweeps.asha import MODES, rung_steps
from ..apps.session.placement import LOCAL_FILES
from ..apps.session.rundir import check_stage_name
from ..apps.sweeps.journal import SweepRecord
from ..apps.sweeps.sample import Sampled
from ..apps.sweeps.space import expand, merged, trial_name
from ..apps.sweeps.view import best_first, figure, table
from ..apps.sweeps.watch import ASKED_ALL, NOTHING_NOW, Run, Trial, Watch
from ..apps.sweeps.trialfiles import EndpointFiles, LocalFiles
from ..apps.session.workflow import Workflow, current_workflow
from ..common import stagedir, yamlfile
from ..core.log import get_logger
from ..errors import ConfigError
from ..sites import globus
from ..sites.capacity import stages_at_once
from .config import load_config

SCHEDULERS = ("asha", "asha-promote", "none")


def sweep(space: Any, *, steps: int, metric: str = "loss", mode: str = "min", scheduler: str = "asha",
          min_steps: int | None = None, eta: int = 3, window: int | None = None,
          trial: Callable[..., Any] | None = None, trial_resumes: bool = False, slots: int | None = None,
          base: Mapping[str, Any] | str | os.PathLike | None = None, name: str = "sweep", **call: Any) -> list[Trial]:
    """Run a trial per configuration of ``space`` (a list of configurations, a mapping of lists: their
    grid, or ``pt.Sampled``: an Optuna sampler's; over ``base``), each for ``steps`` steps; with
    ``scheduler="asha"`` a trial is judged on ``metric`` (``mode`` min or max) at ``min_steps * eta**k``
    steps and stopped unless it is in the best ``1/eta`` of the trials judged there before it; with
    ``"asha-promote"`` it is paused there instead, its slot freed, and goes on from its checkpoint once it
    ranks in that best ``1/eta`` (before any new trial starts); ``slots`` trials run at once (default: as
    many as the site's blocks run). ``trial(config, stage=...)`` submits the trial's stage and returns its
    future (default: the built-in train; a stage of your own must record ``metric`` in its history and call
    ``pt.should_checkpoint()`` each step to be stoppable, and is paused only with ``trial_resumes=True``:
    its loop resumes from its own checkpoint). Other keyword arguments go to each trial's stage call
    (``ranks_per_node=1``, ``num_nodes``, ``site``...). Returns the trials, best first (finished by their
    final value, then stopped ones by the rungs they passed)."""
    if not isinstance(name, str) or len(name) > 90:
        raise ConfigError(f"pt.sweep(name={name!r}): a name of at most 90 letters, digits, '.', '_' or '-'")
    check_stage_name(f"{name}-00000000", explicit=True)  # (its trials' stages: NAME-<digest>)
    sampled, shared = (space if isinstance(space, Sampled) else None), _base(base)
    rules = _rules(steps, metric, mode, scheduler, min_steps, eta, window, slots, sampled is not None)
    if trial is not None and not callable(trial):
        raise ConfigError(f"pt.sweep(trial={trial!r}): give a function (config, stage=...) -> a stage's future")
    configs = [] if sampled else [{**c, "steps": steps} if trial is None else c for c in expand(space, shared)]
    if trial is None:
        _check_train(configs, metric, name)
    wf = current_workflow(name)
    log = get_logger("parsl_torch.workflow")
    files = _trial_files(wf, name, call.get("site"))  # (a site it cannot watch is refused before anything is written)
    if scheduler == "asha-promote" and trial is not None and not trial_resumes:
        rules["scheduler"] = "asha"  # (said once)
        log.warning("sweep %r: the trials of your own function are stopped at their rungs, not paused: a paused "
                    "trial goes on from its checkpoint, and the sweep cannot see whether your loop resumes from "
                    "one (pass trial_resumes=True when it does: docs/sweeps.md)", name)
    concurrent = _slots(wf, call, slots) if rules["scheduler"] == "asha-promote" else 0
    try:
        record = SweepRecord.open(wf.run_dir, name, rules, log)
        starts = _Starts(wf, name, rules, record, trial, call, files)
        if sampled is None:
            # submitted in the order of their names (digests: a fixed shuffle), so that a space listed from poor
            # to good does not reach each rung best-last, where every trial would be the best so far and go on
            configs.sort(key=lambda c: trial_name(name, c))
            starts.prepare(configs)  # (every configuration checked, and where the trials go: now they start)
            record.keep_only({trial_name(name, c) for c in configs})
            runs, more = ([], _Queue(starts, configs)) if concurrent else ([starts.start(c) for c in configs], None)
        else:
            sampled.replay([t.config for t in record.trials.values()])
            runs, more = [], lambda running: starts.ask(sampled, shared, steps if trial is None else None, metric)
            concurrent = sampled.concurrent
        log.info("sweep %r: %s trial(s), %s", name, sampled.trials if sampled else len(configs), _describe(rules))
        watch = Watch(name, rules, record, log, on_end=_teller(sampled, record, rules), files=files)
        if isinstance(more, _Queue):
            more.watch = watch
        watch.until_done(runs, more, concurrent)
        watch.stop_paused()
    finally:
        files.close()
    saved = record.as_dict()
    drawn = figure(wf.run_dir, name, saved, {run.stage: run.stage_dir for run in starts.runs})
    log.info("%s\nfigure: %s", table(wf.run_dir, name, saved), drawn)
    if starts.runs and all(saved["trials"][r.stage]["state"] == "failed" for r in starts.runs):
        starts.runs[0].future.result()  # every trial failed: the first one's error is the sweep's
    return [watch.trial(stage) for stage in best_first(saved)]


class _Starts:
    """Where each trial goes and its start: its stage directory (with the rungs), its record, its call."""

    def __init__(self, wf: Workflow, name: str, rules: dict[str, Any], record: SweepRecord,
                 trial: Callable[..., Any] | None, call: dict[str, Any], files: LocalFiles | EndpointFiles) -> None:
        self.wf, self.name, self.rules, self.record, self.trial, self.call = wf, name, rules, record, trial, call
        self.files = files
        self.runs: list[Run] = []

    def place(self, config: dict[str, Any]) -> Path:
        stage = trial_name(self.name, config)
        return self.wf.placement(stage, self.call.get("site")).stage_dir(self.wf.run_dir, stage)

    def prepare(self, configs: list[dict[str, Any]]) -> None:
        """Each trial's stage directory, with the rungs its stage reads (one write for all through an endpoint)."""
        dirs = [self.place(config) for config in configs]
        if self.rules["rungs"]:
            self.files.put([(d / stagedir.RUNGS, stagedir.RungsRecord(self.rules["rungs"], self.files.poll_s)) for d in dirs])

    def start(self, config: dict[str, Any]) -> Run:
        """The trial's stage submitted (its directory prepared)."""
        stage, stage_dir = trial_name(self.name, config), self.place(config)
        self.record.add(stage, config)
        self.runs.append(Run(stage, stage_dir, (self.trial or _train)(config, stage=stage, **self.call)))
        return self.runs[-1]

    def ask(self, sampled: Sampled, shared: Mapping[str, Any], steps: int | None, metric: str) -> Any:
        """The sampler's next trial, started (None: its point is a trial of this run already; ASKED_ALL)."""
        got = sampled.ask()
        if got is None:
            return ASKED_ALL
        optuna_trial, point = got
        config = merged(shared, point, f"the sampler's point {point}")
        if steps is not None:
            config["steps"] = steps
            _check_train([config], metric, self.name)
        if not sampled.asked(trial_name(self.name, config), optuna_trial):
            return None
        self.prepare([config])
        return self.start(config)


class _Queue:
    """What starts next under ``asha-promote`` when a slot is free: the paused trial that ranks now, else the
    next new one (a rerun's trials started before first: a running one's checkpoint is waiting); nothing
    left once no trial is new, none runs and none ranks."""

    def __init__(self, starts: _Starts, configs: list[dict[str, Any]]) -> None:
        self.starts, self.watch = starts, None
        before = {k for k, t in starts.record.trials.items() if t.state != "pending"}
        self.new = sorted(configs, key=lambda c: trial_name(starts.name, c) not in before)  # (stable: name order)

    def __call__(self, running: int) -> Any:
        trials = self.starts.record.trials
        stage = self.watch.again.pop(0) if self.watch.again else None  # (its promotion made again after a kill)
        if stage is None and (chosen := self.watch.promotions.next()) is not None:
            stage = chosen[0]
            self.watch.promote(stage, self.starts.place(trials[stage].config))
        if stage is not None:
            self.starts.wf.release_name(stage)  # (its call ended, paused: the same call goes on)
            return self.starts.start(trials[stage].config)
        if self.new:
            return self.starts.start(self.new.pop(0))
        return NOTHING_NOW if running else ASKED_ALL


def _slots(wf: Workflow, call: Mapping[str, Any], slots: int | None) -> int:
    """The trials ``asha-promote`` runs at once: ``slots``, else as many as the site's blocks run at once."""
    if slots is not None:
        return slots
    spec = wf.placement("sweep", call.get("site")).site.spec
    return max(1, stages_at_once(spec) // max(1, int(call.get("num_nodes") or 1))) * spec.provider.max_blocks


def _teller(sampled: Sampled | None, record: SweepRecord, rules: dict[str, Any]) -> Callable[[str], None] | None:
    """What tells the sampler a trial's end (None: no sampler)."""
    if sampled is None:
        return None

    def tell(stage: str) -> None:
        t = record.trials[stage]
        sampled.tell(stage, t.state, t.value, [(rules["rungs"][d["rung"]], d["value"]) for d in t.decisions])

    return tell


def _rules(steps: int, metric: str, mode: str, scheduler: str, min_steps: int | None, eta: int,
           window: int | None, slots: int | None, sampled: bool) -> dict[str, Any]:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"pt.sweep(steps={steps!r}): the budget of a trial, an int >= 1")
    if scheduler not in SCHEDULERS:
        raise ConfigError(f"pt.sweep(scheduler={scheduler!r}): use one of {', '.join(SCHEDULERS)}")
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or slots < 1):
        raise ConfigError(f"pt.sweep(slots={slots!r}): the trials to run at once, an int >= 1")
    if sampled and scheduler == "asha-promote":
        raise ConfigError("pt.sweep(scheduler='asha-promote'): a sampler's trials are stopped, not paused (a "
                          "sampler told of a paused trial could not be told it went on): use scheduler='asha'")
    if mode not in MODES:
        raise ConfigError(f"pt.sweep(mode={mode!r}): use 'min' (a loss) or 'max' (an accuracy)")
    if not isinstance(metric, str) or not metric:
        raise ConfigError(f"pt.sweep(metric={metric!r}): name a metric the trial's history records ('loss')")
    if isinstance(eta, bool) or not isinstance(eta, int) or eta < 2:
        raise ConfigError(f"pt.sweep(eta={eta!r}): use an int >= 2 (each rung keeps the best 1/eta)")
    min_steps = max(1, steps // eta ** 3) if min_steps is None else min_steps
    rungs = rung_steps(min_steps, eta, steps) if scheduler != "none" else []
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
        loaded = yamlfile.safe_load(Path(base).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"pt.sweep(base={str(base)!r}): {exc}: give a YAML file of settings or a mapping") from None
    if not isinstance(loaded, Mapping):
        raise ConfigError(f"pt.sweep(base={str(base)!r}): the file holds {type(loaded).__name__}, not a mapping")
    return loaded


def _describe(rules: dict[str, Any]) -> str:
    if not rules["rungs"]:
        return f"every one to step {rules['steps']} (scheduler='none')"
    rest = "the others wait there until they rank" if rules["scheduler"] == "asha-promote" else "the others stop"
    return (f"judged on {rules['metric']} ({rules['mode']}) at steps {', '.join(map(str, rules['rungs']))}; "
            f"the best 1/{rules['eta']} at each go on, {rest}")


def _check_train(configs: list[dict[str, Any]], metric: str, name: str) -> None:
    """Every configuration checked as the train stage will, before any trial is submitted."""
    from .train import UNITS, TrainConfig

    recorded = ("loss", *UNITS)  # (what the train stage records: its loss, and the metrics it gives units)
    if metric not in recorded:
        raise ConfigError(f"pt.sweep(metric={metric!r}): the train stage records {', '.join(recorded)}")
    for config in configs:
        load_config(config, TrainConfig, trial_name(name, config))


def _train(config: dict[str, Any], stage: str, **call: Any) -> Any:
    from .train import train

    return train(config, stage=stage, **call)


def _trial_files(wf: Workflow, name: str, site: str | None) -> LocalFiles | EndpointFiles:
    """Where the watcher reads the trials' histories (to judge them at their rungs, and to rank the finished
    ones) and leaves their rungs and rulings: here, or through the site's I/O endpoint when the trials'
    files are an endpoint's that this machine cannot read."""
    placement = wf.placement(name, site)
    g = placement.site.spec.globus
    if placement.file_system == LOCAL_FILES:
        return LocalFiles()
    if g is None or not g.io_endpoint_id:
        raise ConfigError(f"pt.sweep: site {placement.site.name!r} runs stages on a Globus Compute endpoint whose "
                          f"files this process cannot read (it sees {placement.file_system!r}), and a sweep reads "
                          f"each trial's history to judge it and to rank the finished ones: give its site file "
                          f"globus.io_endpoint_id (a thread-pool endpoint on the same file system: parsl-torch "
                          f"sites endpoint-config {placement.site.name} --io), or use an endpoint that sees this "
                          f"machine's files (globus.file_system: local)")
    return EndpointFiles(globus.make_executor(g.io_endpoint_id), g.io_endpoint_id)
