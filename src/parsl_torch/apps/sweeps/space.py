"""A sweep's space of configurations.

The space is a list of configurations, or a mapping of lists (their grid); keys may be dotted
(``"model.dim"``) to reach into a section, and a point may not name a section and a key in it both (one
would overwrite the other). Each configuration is one trial, named by a digest of its settings, so that the
same configuration is one trial however often it is listed, and keeps its name (and its stage directory)
when the space grows. The caller's objects are copied, never changed; a space of more than ``MAX_TRIALS``
configurations is refused before any is made.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import ConfigError

#: the most configurations a sweep's space may hold (each is a stage, its directory and its journal lines)
MAX_TRIALS = 10_000


def expand(space: Any, base: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The configurations of ``space`` (each over ``base``), duplicates once, in the order given."""
    if isinstance(space, Mapping):
        if not space:
            raise ConfigError("pt.sweep(space={}): give each setting's values, e.g. {'lr': [1e-3, 3e-3]}")
        for key, values in space.items():
            if not isinstance(values, Sequence) or isinstance(values, (str, bytes)) or not values:
                raise ConfigError(f"pt.sweep(space[{key!r}]={values!r}): give a non-empty list of values "
                                  f"(a grid takes every combination)")
        _not_too_large(math.prod(len(v) for v in space.values()), " x ".join(str(len(v)) for v in space.values()))
        _no_overlap(space, "its space")
        points = [dict(zip(space, combo)) for combo in itertools.product(*space.values())]
    elif isinstance(space, Sequence) and not isinstance(space, (str, bytes)) and space:
        _not_too_large(len(space), "listed")
        points = list(space)
    else:
        raise ConfigError(f"pt.sweep(space={space!r}): give a list of configurations or a mapping of "
                          f"lists (their grid)")
    configs: dict[str, dict[str, Any]] = {}  # canonical form -> the first configuration of that form
    for i, point in enumerate(points):
        if not isinstance(point, Mapping):
            raise ConfigError(f"pt.sweep: space[{i}] is {type(point).__name__}, not a mapping of settings")
        config = merged(base, point, f"space[{i}]")
        configs.setdefault(canonical(config), config)
    return list(configs.values())


def merged(base: Mapping[str, Any], point: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``base`` with ``point``'s settings (dotted keys reach into sections; copies: the caller's objects are
    never changed); ``where`` names the point."""
    config = json.loads(json.dumps(dict(base)))
    _no_overlap(point, where)
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
        target[last] = copy.deepcopy(value)
    return config


def _no_overlap(point: Mapping[Any, Any], where: str) -> None:
    """Refuse a section and a key in it both (``model`` and ``model.dim``): one would overwrite the other,
    in an order that is the mapping's."""
    keys = sorted(k for k in point if isinstance(k, str))
    for key, inner in itertools.product(keys, keys):
        if inner.startswith(f"{key}."):
            raise ConfigError(f"pt.sweep: {where} sets both {key!r} and {inner!r}, and one would overwrite the "
                              f"other: give {inner!r} alone, or the whole {key!r} section with its {inner[len(key) + 1:]!r} "
                              f"in it")


def _not_too_large(size: int, shape: str) -> None:
    if size > MAX_TRIALS:
        raise ConfigError(f"pt.sweep: its space holds {size:,} configurations ({shape}), more than a sweep runs "
                          f"(at most {MAX_TRIALS:,} trials, each a stage): narrow its lists, or draw from it with "
                          f"pt.Sampled(study, params, trials=...)")


def canonical(config: Mapping[str, Any]) -> str:
    try:
        return json.dumps(config, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"pt.sweep: a configuration is not plain JSON data ({exc}): use numbers, strings, "
                          f"booleans, lists and mappings") from None


def trial_name(sweep: str, config: Mapping[str, Any]) -> str:
    return f"{sweep}-{hashlib.sha256(canonical(config).encode()).hexdigest()[:8]}"
