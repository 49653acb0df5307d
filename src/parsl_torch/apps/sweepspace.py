"""A sweep's space of configurations, and the record of its decisions that survives the workflow.

The space is a list of configurations, or a mapping of lists (their grid); keys may be dotted
(``"model.dim"``) to reach into a section. Each configuration is one trial, named by a digest of its
settings, so that the same configuration is one trial however often it is listed, and keeps its name
(and its stage directory) when the space grows.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..common.files import write_atomic
from ..errors import ConfigError


def expand(space: Any, base: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The configurations of ``space`` (each over ``base``), duplicates once, in the order given."""
    if isinstance(space, Mapping):
        if not space:
            raise ConfigError("pt.sweep(space={}): give each setting's values, e.g. {'lr': [1e-3, 3e-3]}")
        for key, values in space.items():
            if not isinstance(values, Sequence) or isinstance(values, (str, bytes)) or not values:
                raise ConfigError(f"pt.sweep(space[{key!r}]={values!r}): give a non-empty list of values "
                                  f"(a grid takes every combination)")
        points = [dict(zip(space, combo)) for combo in itertools.product(*space.values())]
    elif isinstance(space, Sequence) and not isinstance(space, (str, bytes)) and space:
        points = list(space)
    else:
        raise ConfigError(f"pt.sweep(space={space!r}): give a list of configurations or a mapping of "
                          f"lists (their grid)")
    configs, seen = [], set()
    for i, point in enumerate(points):
        if not isinstance(point, Mapping):
            raise ConfigError(f"pt.sweep: space[{i}] is {type(point).__name__}, not a mapping of settings")
        config = _merged(base, point, f"space[{i}]")
        key = canonical(config)
        if key not in seen:
            seen.add(key)
            configs.append(config)
    return configs


def _merged(base: Mapping[str, Any], point: Mapping[str, Any], where: str) -> dict[str, Any]:
    config = json.loads(json.dumps(dict(base)))
    for key, value in point.items():
        if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"pt.sweep: {where} has the key {key!r}: use a setting's name, dotted for a "
                              f"section's (model.dim)")
        *sections, last = key.split(".")
        target = config
        for section in sections:
            target = target.setdefault(section, {})
            if not isinstance(target, dict):
                raise ConfigError(f"pt.sweep: {where}: {key!r} reaches into {section!r}, which is not a section")
        target[last] = value
    return config


def canonical(config: Mapping[str, Any]) -> str:
    try:
        return json.dumps(config, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"pt.sweep: a configuration is not plain JSON data ({exc}): use numbers, strings, "
                          f"booleans, lists and mappings") from None


def trial_name(sweep: str, config: Mapping[str, Any]) -> str:
    return f"{sweep}-{hashlib.sha256(canonical(config).encode()).hexdigest()[:8]}"


@dataclass
class TrialRecord:
    config: dict[str, Any]
    state: str = "pending"  # pending | running | stopped | finished | failed
    step: int | None = None  # the last step seen (stopped: where it stopped)
    call: str | None = None  # the call its decisions were made on (another call: made again)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    result: Any = None  # its stage's result (the train stage's summary)
    value: float | None = None  # the metric at its last step (finished trials: how they rank)
    why: str = ""  # stopped: at which rung and cut; failed: the error


@dataclass
class SweepRecord:
    """``<run_dir>/.sweep.<name>.json``: the rules, each trial's state and the decisions in the order
    they were made (their order is what an asynchronous rule judges by)."""

    rules: dict[str, Any]
    trials: dict[str, TrialRecord] = field(default_factory=dict)
    order: list[list[Any]] = field(default_factory=list)  # [trial, rung] as decided
    _written: str = field(default="", repr=False, compare=False)

    @staticmethod
    def path(run_dir: Path, name: str) -> Path:
        return Path(run_dir) / f".sweep.{name}.json"

    @classmethod
    def load(cls, run_dir: Path, name: str, rules: dict[str, Any], log: Any) -> SweepRecord:
        path = cls.path(run_dir, name)
        try:
            data = json.loads(path.read_text())
            record = cls(data["rules"], {k: TrialRecord(**v) for k, v in data["trials"].items()}, data["order"])
        except FileNotFoundError:
            return cls(rules)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("sweep %r: %s cannot be read (%s): its decisions are made again", name, path, exc)
            return cls(rules)
        if record.rules != rules:
            log.warning("sweep %r: its rules changed since %s was written (%s): its decisions are made again",
                        name, path, ", ".join(k for k in rules if rules[k] != record.rules.get(k)))
            return cls(rules, {k: TrialRecord(t.config) for k, t in record.trials.items()})
        return record

    def save(self, run_dir: Path, name: str) -> None:
        """Written when it changed (a workflow saves it at every look at its trials)."""
        data = {"rules": self.rules, "trials": {k: asdict(v) for k, v in self.trials.items()}, "order": self.order}
        text = json.dumps(data, indent=1)
        if text != self._written:
            write_atomic(self.path(run_dir, name), text)
            self._written = text

    def keep_only(self, trials: set[str]) -> None:
        """The trials of this sweep's space (one left out of it since is forgotten, with its decisions)."""
        self.trials = {k: v for k, v in self.trials.items() if k in trials}
        self.order = [o for o in self.order if o[0] in trials]

    def forget_other_call(self, trial: str, call: str | None) -> bool:
        """Whether ``trial``'s decisions were made on another call than ``call`` (its code, config or inputs
        changed): then they are forgotten, to be made again."""
        t = self.trials[trial]
        dropped = bool(t.call and call and t.call != call and t.decisions)
        if dropped:
            t.decisions, t.why = [], ""
            self.order = [o for o in self.order if o[0] != trial]
        t.call = call or t.call
        return dropped
