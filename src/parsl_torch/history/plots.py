"""PNG plots of a history file: one per metric against step, with the
cross-rank min-max band and mean where the file has them."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .h5file import dataset_name, read_history

MAX_POINTS = 2000  # per line: enough for the eye, fast for long runs


def plots_dir(path: str | os.PathLike) -> Path:
    """``train.h5`` -> ``train-plots/`` beside it."""
    path = Path(path)
    return path.with_name(f"{path.stem}-plots")


def constant(values: np.ndarray) -> float | None:
    """The one value a metric holds at every step (a fixed learning rate), else None."""
    finite = values[np.isfinite(values)]
    return float(finite[0]) if len(finite) and np.all(finite == finite[0]) else None


def plot_history(path: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write ``<metric>.png`` for every metric that changes (a constant one is a number, not a plot);
    returns the files written."""
    from matplotlib.figure import Figure  # object API: no pyplot state, no display
    from matplotlib.ticker import MaxNLocator

    data = read_history(path)
    out = Path(out_dir) if out_dir is not None else plots_dir(path)
    out.mkdir(parents=True, exist_ok=True)
    stride = max(1, len(data.steps) // MAX_POINTS)
    steps = data.steps[::stride]
    written = []
    for metric, values in data.metrics.items():
        if constant(values) is not None:
            continue
        fig = Figure(figsize=(6, 3.5), layout="constrained")
        ax = fig.add_subplot()
        if stats := data.stats.get(metric):
            ax.fill_between(steps, stats["min"][::stride], stats["max"][::stride], alpha=0.25,
                            label=f"min-max over {data.attrs.get('world_size', '?')} ranks")
            ax.plot(steps, stats["mean"][::stride], label="mean over ranks")
        ax.plot(steps, values[::stride], lw=0.8, label="rank 0" if stats else metric)
        unit = data.units.get(metric, "1")
        ax.set(xlabel="step", ylabel=metric if unit == "1" else f"{metric} ({unit})",
               title=f"{data.attrs.get('stage', '')}: {metric}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
        if np.isfinite(values).any() or stats:
            ax.legend(loc="best", fontsize="small")
        target = out / f"{dataset_name(metric)}.png"
        fig.savefig(target, dpi=100)
        written.append(target)
    return written
