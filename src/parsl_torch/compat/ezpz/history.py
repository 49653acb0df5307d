"""``ezpz.history``: ezpz's ``History`` on parsl-torch's History (an HDF5 file per run)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core.ranks import get_rank
from ...errors import ConfigError
from ...history import recorder as _recorder
from ...history.blocks import Block
from .utils import get_timestamp, not_covered

__all__ = ["History"]

#: cross-rank statistics, under ezpz's names (``"loss/mean"``)
STAT_NAMES = ("mean", "max", "min", "std")


class _Tracker:
    """``history.tracker``: ``log(metrics, step=None, commit=None)`` to the history's sinks (rank 0)."""

    def __init__(self, history: _recorder.History) -> None:
        self._history = history

    def log(self, metrics: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
        sinks = self._history._sinks
        if sinks is not None:
            sinks.log(step if step is not None else -1, {k: float(v) for k, v in metrics.items()})


class _JSONLSink:
    """One JSON object per update (ezpz's ``jsonl_path``), appended on rank 0."""

    def __init__(self, path: str | os.PathLike, overwrite: bool) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w" if overwrite else "a")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class _Synced:
    """What this rank's History synced, for ``history.history``: each metric's values and, on rank 0
    over several ranks, its cross-rank ``mean``/``max``/``min``/``std`` under ezpz's names (``"loss/mean"``)."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def __call__(self, block: Block) -> None:
        for row, key in enumerate(block.keys):
            self.values.setdefault(key, []).extend(block.values[row].tolist())
            for stat in STAT_NAMES if block.stats and get_rank() == 0 else ():
                self.values.setdefault(f"{key}/{stat}", []).extend(block.stats[stat][row].tolist())


class History:
    """ezpz.History on parsl-torch's History: every rank calls ``update``; cross-rank mean, min, max,
    std are made every ``sync_every`` updates (1, the default: at every update, as ezpz) and
    appear in ``history.history["loss/mean"]`` on rank 0 from then on; ``finalize`` may run on rank 0 alone
    and returns an ``xarray.Dataset`` there (None on other ranks)."""

    def __init__(self, keys: Sequence[str] | None = None, *, report_dir: str | os.PathLike | None = None,
                 report_enabled: bool = True, jsonl_path: str | os.PathLike | None = None,
                 jsonl_overwrite: bool = False, distributed_history: bool = True, project_name: str | None = None,
                 backends: str | Sequence[str] | None = None, config: Mapping[str, Any] | None = None,
                 outdir: str | os.PathLike | None = None, tracker: Any = None, sync_every: int = 1) -> None:
        if tracker is not None:
            raise not_covered("History(tracker=...)", "pass sinks through backends='wandb,csv'")
        names = backends.split(",") if isinstance(backends, str) else list(backends or [])
        unknown = [b for b in names if b.strip() not in ("wandb", "csv", "")]
        if unknown:
            raise ConfigError(f"History(backends={backends!r}): {', '.join(unknown)} not covered; use wandb, csv")
        sinks: list[Any] = [b.strip() for b in names if b.strip()]
        if jsonl_path is not None and get_rank() == 0:
            sinks.append(_JSONLSink(jsonl_path, jsonl_overwrite))
        self._synced = _Synced()
        self.outdir = Path(outdir) if outdir is not None else None
        self.report_dir = report_dir  # ezpz's markdown report is not made: the plots are beside the file
        self._history = _recorder.History(project_name or "history", config=config, sinks=sinks,
                                          sync_every=sync_every if distributed_history else 0,
                                          on_sync=self._synced)
        self.keys = list(keys or [])

    @property
    def tracker(self) -> _Tracker:
        return _Tracker(self._history)

    @property
    def history(self) -> dict[str, list[float]]:
        """ezpz's flat view on rank 0: ``{"loss": [...], "loss/mean": [...], ...}``, the rows synced so far."""
        return self._synced.values

    data = history

    def update(self, metrics: Mapping[str, Any], precision: int = 6, use_wandb: bool | None = None,
               commit: bool | None = True, summarize: bool | None = True, step: int | None = None) -> str:
        """Record this rank's metrics; returns ``"loss=0.123456 dt=0.010000"`` with ``precision`` digits."""
        metrics = dict(metrics)
        if step is None and "step" not in metrics and isinstance(metrics.get("iter"), int):
            step = metrics["iter"]  # ezpz scripts count steps in "iter"
        self._history.update(metrics, step=step)
        if not summarize:
            return ""
        return " ".join(f"{k}={_fmt(v, precision)}" for k, v in metrics.items())

    def finalize(self, outdir: str | os.PathLike | None = None, run_name: str | None = None,
                 dataset_fname: str | None = None, warmup: int | float | None = 0.0, save: bool = True,
                 plot: bool = True, **ignored: Any) -> Any:
        """Write ``<outdir>/<dataset_fname or run_name or 'history'>.h5`` on rank 0 (alone or with the
        others: any rank may call it, none waits); returns its xarray.Dataset on rank 0."""
        if warmup:
            raise not_covered("finalize(warmup=...)", "drop the warmup steps when you read the dataset "
                                                       "(ds.sel(step=slice(N, None)))")
        base = Path(outdir) if outdir is not None else self.outdir or Path("outputs") / "ezpz" / get_timestamp()
        name = dataset_fname or run_name or "history"
        if get_rank() == 0:
            base.mkdir(parents=True, exist_ok=True)  # ezpz makes its output directory
        path = self._history.finalize(base / (name if name.endswith(".h5") else f"{name}.h5"), plot=plot,
                                      ranks="this")
        if get_rank() != 0:
            return None
        try:
            from ...history.h5file import load_history

            return load_history(path)
        except ImportError:
            print(f"ezpz compat: history at {path} (pip install 'parsl-torch[history]' for the xarray dataset)",
                  file=sys.stderr)
            return path


def _fmt(value: Any, precision: int) -> str:
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        return str(value)
    return str(int(number)) if isinstance(value, int) and not isinstance(value, bool) else f"{number:.{precision}f}"
