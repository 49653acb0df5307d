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


def plot_history(path: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write ``<metric>.png`` for every metric; returns the files written."""
    from matplotlib.figure import Figure  # object API: no pyplot state, no display

    data = read_history(path)
    out = Path(out_dir) if out_dir is not None else plots_dir(path)
    out.mkdir(parents=True, exist_ok=True)
    stride = max(1, len(data.steps) // MAX_POINTS)
    steps = data.steps[::stride]
    written = []
    for metric, values in data.metrics.items():
        fig = Figure(figsize=(6, 3.5), layout="constrained")
        ax = fig.add_subplot()
        stats = data.stats.get(metric)
        if stats:
            ax.fill_between(steps, stats["min"][::stride], stats["max"][::stride], alpha=0.25,
                            label=f"min-max over {data.attrs.get('world_size', '?')} ranks")
            ax.plot(steps, stats["mean"][::stride], label="mean over ranks")
        ax.plot(steps, values[::stride], lw=0.8, label="rank 0" if stats else metric)
        ax.set(xlabel="step", ylabel=metric, title=f"{data.attrs.get('stage', '')}: {metric}")
        if np.isfinite(values).any() or stats:
            ax.legend(loc="best", fontsize="small")
        target = out / f"{dataset_name(metric)}.png"
        fig.savefig(target, dpi=100)
        written.append(target)
    return written
