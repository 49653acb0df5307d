"""Rows of several steps as one block: what History keeps between syncs and writes to its file."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from .stats import STATS


#: a step at which a metric was not recorded: a NaN of its own (a quiet NaN with a payload), so that a file tells
#: it from a NaN the metric had (a loss that diverged); every reader sees both as NaN
MISSING_BITS = 0x7FF80000000D0A7A
MISSING = struct.unpack("<d", struct.pack("<Q", MISSING_BITS))[0]


def is_missing(values: np.ndarray) -> np.ndarray:
    """Where ``values`` (float64) holds MISSING: not recorded, as against a recorded NaN."""
    return np.ascontiguousarray(values, dtype=np.float64).view(np.uint64) == MISSING_BITS


@dataclass
class Block:
    """Rows of several steps: ``values`` and each ``stats`` matrix are keys x steps
    (one contiguous row per metric: what the file's datasets want)."""

    steps: np.ndarray
    keys: tuple[str, ...]
    values: np.ndarray
    stats: dict[str, np.ndarray]

    def widen(self, keys: tuple[str, ...]) -> Block:
        """The same rows over ``keys`` (a superset), NaN in the new columns."""
        if keys == self.keys:
            return self
        idx = [keys.index(k) for k in self.keys]

        def spread(m: np.ndarray) -> np.ndarray:
            out = np.full((len(keys), len(self.steps)), MISSING)
            out[idx] = m
            return out

        return Block(self.steps, keys, spread(self.values), {s: spread(m) for s, m in self.stats.items()})

    @staticmethod
    def merge(blocks: list[Block]) -> tuple[np.ndarray, dict, dict]:
        """(steps, {metric: values}, {metric: {stat: values}}) of all blocks in order."""
        keys = tuple(dict.fromkeys(k for b in blocks for k in b.keys))
        wide = [b.widen(keys) for b in blocks]
        steps = np.concatenate([b.steps for b in wide]) if wide else np.empty(0, np.int64)
        values = np.concatenate([b.values for b in wide], axis=1) if wide else np.empty((0, 0))
        stats: dict[str, dict[str, np.ndarray]] = {}
        if wide and all(b.stats for b in wide):  # else one process, or a failure flush
            per_stat = {s: np.concatenate([b.stats[s] for b in wide], axis=1) for s in STATS}
            stats = {k: {s: per_stat[s][j] for s in STATS} for j, k in enumerate(keys)}
        return steps, dict(zip(keys, values)), stats


def as_float(key: str, value: Any) -> float:
    try:
        return float(value)
    except OverflowError:
        raise ConfigError(f"metric {key!r}: the value is too large for a float") from None
    except (TypeError, ValueError):
        shape = getattr(value, "shape", None)
        what = f"a tensor/array of shape {tuple(shape)}" if shape not in (None, ()) else repr(value)
        raise ConfigError(f"metric {key!r} is {what}, not a number: pass a scalar "
                          f"(e.g. loss.item()) or leave it out of update()") from None


def as_step(value: Any) -> int:
    try:
        step = int(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"step {value!r} is not a whole number") from None
    if step != value and not isinstance(value, str) or step < 0:
        raise ConfigError(f"step {value!r}: use a whole number >= 0")
    return step
