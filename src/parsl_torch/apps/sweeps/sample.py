"""``pt.Sampled``: a sweep's configurations proposed by an Optuna sampler, through its ask-and-tell
interface (``pip install parsl-torch[sweeps]``). The sweep asks for a configuration when a slot of its
``concurrent`` is free and tells the study each trial's end: its final value, or pruned (with the values
at the rungs it passed) where ASHA cut it, or failed. The sampler is Optuna's (TPE, random, CMA-ES, a
grid...): nothing of it is written here.

A rerun asks the configurations its journal holds first, in their order (enqueued in the study): the
same trials, which the memoizer skips where they ended; the study is told their results again, so the
configurations asked after them follow from the same history.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from functools import reduce
from typing import Any

from ...errors import ConfigError


class Sampled:
    """``trials`` configurations from ``study``'s sampler, each a point of ``params`` (name -> an Optuna
    distribution; dotted names reach into a config's sections), at most ``concurrent`` running at once
    (each later one is asked with the results of those before it)."""

    def __init__(self, study: Any, params: Mapping[str, Any], trials: int, concurrent: int = 4) -> None:
        try:
            import optuna
        except ImportError:
            raise ConfigError("pt.Sampled needs Optuna: pip install 'parsl-torch[sweeps]'") from None
        if not isinstance(study, optuna.Study):
            raise ConfigError(f"pt.Sampled(study={study!r}): give an optuna.Study (optuna.create_study(sampler=...))")
        if not isinstance(params, Mapping) or not params or not all(
                isinstance(k, str) and isinstance(v, optuna.distributions.BaseDistribution) for k, v in params.items()):
            raise ConfigError(f"pt.Sampled(params={params!r}): give each setting's Optuna distribution, e.g. "
                              f"{{'lr': optuna.distributions.FloatDistribution(1e-5, 1e-1, log=True)}}")
        for name, value in (("trials", trials), ("concurrent", concurrent)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"pt.Sampled({name}={value!r}): use an int >= 1")
        self.study, self.params, self.trials, self.concurrent = study, dict(params), trials, concurrent
        self._asked: dict[str, list[Any]] = {}  # trial's stage -> its Optuna trials (a point asked twice: two)
        self._count = 0
        self._ended: dict[str, tuple[str, float | None, list[tuple[int, float]]]] = {}

    def replay(self, configs: list[dict[str, Any]]) -> None:
        """The configurations an earlier run asked (the journal's order) are asked first."""
        for config in configs[:self.trials]:
            self.study.enqueue_trial({name: reduce(operator.getitem, name.split("."), config) for name in self.params})

    def ask(self) -> tuple[Any, dict[str, Any]] | None:
        """(the Optuna trial, its point: setting -> value), or None when ``trials`` were asked."""
        if self._count >= self.trials:
            return None
        self._count += 1
        trial = self.study.ask(self.params)
        return trial, dict(trial.params)

    def asked(self, stage: str, trial: Any) -> bool:
        """Whether ``stage`` is new to this run (a point asked again is told the same trial's end: at once
        when it ended, else with it)."""
        if stage in self._ended:
            self._asked[stage] = [trial]
            self.tell(stage, *self._ended[stage])
            return False
        self._asked.setdefault(stage, []).append(trial)
        return len(self._asked[stage]) == 1

    def tell(self, stage: str, state: str, value: float | None, rungs: list[tuple[int, float]]) -> None:
        """The trial's end: finished with ``value``, stopped (pruned, its values at the rungs it passed), or
        failed; every Optuna trial that asked for its point is told."""
        import optuna

        self._ended[stage] = (state, value, rungs)
        for trial in self._asked.pop(stage, []):
            for step, at in rungs:
                trial.report(at, step)
            if state == "finished" and value is not None:
                self.study.tell(trial, value, skip_if_finished=True)
            else:
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED if state == "stopped"
                                else optuna.trial.TrialState.FAIL, skip_if_finished=True)
