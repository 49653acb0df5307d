"""``ezpz.tracker``: ``setup_tracker`` on parsl-torch's sinks (wandb, csv)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core.ranks import get_rank
from ...errors import ConfigError
from ...history.sinks import SafeSinks, make_sinks

__all__ = ["Tracker", "setup_tracker"]


class Tracker:
    """ezpz's Tracker: ``log(metrics, step=None)`` and ``finish()`` on rank 0 (nothing elsewhere)."""

    def __init__(self, sinks: SafeSinks | None) -> None:
        self._sinks, self._step = sinks, 0

    def log(self, metrics: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
        if self._sinks is not None:
            self._step = step if step is not None else self._step + 1
            self._sinks.log(self._step, {k: float(v) for k, v in metrics.items()})

    def finish(self) -> None:
        if self._sinks is not None:
            self._sinks.close()


def setup_tracker(project_name: str | None = None, backends: str | Sequence[str] | None = None,
                  config: Mapping[str, Any] | None = None, outdir: str | os.PathLike | None = None,
                  rank: int | None = None, **kwargs: Any) -> Tracker:
    """``backends``: "wandb", "csv" (``<outdir>/<project_name>.csv``), comma-separated or a list."""
    names = [b.strip() for b in (backends.split(",") if isinstance(backends, str) else backends or ["wandb"])]
    unknown = [b for b in names if b not in ("wandb", "csv", "none", "")]
    if unknown:
        raise ConfigError(f"setup_tracker(backends={backends!r}): {', '.join(unknown)} not covered; use wandb, csv")
    if (get_rank() if rank is None else rank) != 0:
        return Tracker(None)
    name = project_name or "ezpz"
    csv = Path(outdir or ".") / f"{name}.csv"
    return Tracker(make_sinks([b for b in names if b], csv, name, dict(config or {})))
