"""Asynchronous successive halving (ASHA, Li et al. 2020): a trial is judged at a rung when it gets there,
against the trials that got there before it, and goes on only if it is in the best ``1/eta`` of them.
Rungs are at ``min_steps * eta**k`` steps, below the budget. The first trial at a rung always goes on
(it is the best there so far); a trial whose metric is not a number is cut. In the stopping form a trial
that does not go on stops there. In the promotion form (``promoting``: the paper's rule) a trial goes on
when it is among the best ``n // eta`` of the ``n`` trials that reached the rung (at least the best one:
with a finite space, the paper's rule would let none through a rung that fewer than ``eta`` reach, and
no trial would finish); one that is not waits (``Promotions``) until the trials that reach the rung after
it put it there.

Pure bookkeeping: no files, no Parsl (``stages.sweep`` runs the trials and keeps the record).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from ...errors import ConfigError

MODES = ("min", "max")


def rung_steps(min_steps: int, eta: int, steps: int) -> list[int]:
    """The steps at which trials are judged: ``min_steps * eta**k`` below ``steps``."""
    # (eta, steps: ``pt.sweep`` checked them)
    if isinstance(min_steps, bool) or not isinstance(min_steps, int) or min_steps < 1:
        raise ConfigError(f"pt.sweep(min_steps={min_steps!r}): use an int >= 1")
    if min_steps >= steps:
        raise ConfigError(f"pt.sweep(min_steps={min_steps}): the first rung must come before the budget "
                          f"(steps={steps}): use a smaller min_steps, or scheduler='none'")
    rungs, r = [], min_steps
    while r < steps:
        rungs.append(r)
        r *= eta
    return rungs


@dataclass(frozen=True)
class Decision:
    """A trial's judgement at one rung: its value, the cut it was held to (the rung's 1/eta quantile of
    the values there so far, its own included), and whether it goes on."""

    trial: str
    rung: int  # the index of the rung
    value: float
    cut: float
    keep: bool

    def says(self, metric: str, mode: str, step: int) -> str:
        """``rung 1 at step 15: loss 2.31 > cut 1.97``."""
        sign = ">" if mode == "min" else "<"
        return f"rung {self.rung} at step {step}: {metric} {self.value:.4g} {sign} cut {self.cut:.4g}"


@dataclass
class Asha:
    """The values seen at each rung (finite ones, sorted best first, signed: -value when higher is
    better), and the rule that judges the next one."""

    eta: int
    mode: str
    seen: dict[int, list[float]] = field(default_factory=dict)
    promoting: bool = False  # the promotion form's rule: the best max(1, n // eta) of the n values

    def see(self, rung: int, value: float) -> None:
        """``value`` seen at ``rung`` (kept sorted, best first: a judgement is a lookup, not a sort)."""
        self.seen.setdefault(rung, [])
        if math.isfinite(value):
            bisect.insort(self.seen[rung], value if self.mode == "min" else -value)

    def cut(self, rung: int) -> float:
        """The rung's 1/eta quantile of the values seen there (signed, as ``seen``), linear between neighbours
        (numpy's default), on the best-first order; NaN before any value. Promoting: the ``max(1, n // eta)``-th
        best value."""
        signed = self.seen.get(rung, [])
        if not signed:
            return math.nan
        if self.promoting:
            return signed[max(1, len(signed) // self.eta) - 1]
        position = (len(signed) - 1) / self.eta
        low = math.floor(position)
        high = min(low + 1, len(signed) - 1)
        return signed[low] + (signed[high] - signed[low]) * (position - low)

    def judge(self, trial: str, rung: int, value: float) -> Decision:
        """Records ``value`` at ``rung`` and judges it against the values there before it."""
        self.see(rung, value)
        if not math.isfinite(value) or not self.seen[rung]:
            return Decision(trial, rung, value, math.nan, False)
        cut, sign = self.cut(rung), 1 if self.mode == "min" else -1
        return Decision(trial, rung, value, sign * cut, self.ranks(rung, value))

    def ranks(self, rung: int, value: float) -> bool:
        """Whether ``value`` is in the best ``1/eta`` of the values seen at ``rung`` now."""
        return math.isfinite(value) and (value if self.mode == "min" else -value) <= self.cut(rung)


@dataclass
class Promotions:
    """The trials paused at their rungs (trial -> (rung, value)), and which of them goes on next: the one at
    the highest rung that now ranks in its rung's best ``1/eta``, the best of those first."""

    asha: Asha
    paused: dict[str, tuple[int, float]] = field(default_factory=dict)

    def next(self) -> tuple[str, int] | None:
        """(trial, rung) of the paused trial to promote now (None: none ranks)."""
        sign = 1 if self.asha.mode == "min" else -1
        order = sorted(self.paused.items(), key=lambda item: (-item[1][0], sign * item[1][1]))
        return next(((trial, rung) for trial, (rung, value) in order if self.asha.ranks(rung, value)), None)
