"""What a user sees of a sweep: its table (``parsl-torch status``), best first, and one figure of every
trial's curve with the rungs drawn, the stopped trials marked and a gap where a trial paused
(``<run_dir>/sweep-<name>.png``)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...common import stagedir
from .journal import SweepRecord

COLUMNS = ("trial", "state", "value", "settings")


def records(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Each sweep of the run: name -> its record (``.sweep.<name>.jsonl``), unreadable ones left out."""
    return {path.name[len(".sweep."):-len(".jsonl")]: record.as_dict()
            for path in sorted(Path(run_dir).glob(".sweep.*.jsonl"))
            if (record := SweepRecord.replay(path)) is not None}


def _varied(trials: dict[str, Any]) -> list[str]:
    """The settings that differ between the trials (dotted), in the order of the first trial's."""
    flat = [_flat(t["config"]) for t in trials.values()]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    return [k for k in keys if len({json.dumps(f.get(k)) for f in flat}) > 1]


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in config.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _state(run_dir: Path, name: str, t: dict[str, Any]) -> str:
    rungs = len(t["decisions"])
    promoted = f", promoted at rung {', '.join(map(str, t['promoted']))}" if t.get("promoted") else ""
    if t["state"] in ("stopped", "paused"):
        return f"{t['state']} at step {t['step']}, rung {rungs - 1}{promoted}"
    if t["state"] in ("running", "pending"):
        progress = [stagedir.read_or_none(p, stagedir.ProgressRecord)
                    for p in (Path(run_dir) / name).glob("*" + stagedir.PROGRESS_SUFFIX)]
        steps = [p.step + 1 for p in progress if p is not None]
        return (f"running at step {max(steps)}" if steps and t["state"] == "running" else t["state"]) + promoted
    return t["state"] + promoted


def _value(t: dict[str, Any]) -> float | None:
    """A finished trial's final value, else its value at its last rung."""
    return t.get("value") if t["state"] == "finished" else t["decisions"][-1]["value"] if t["decisions"] else None


def best_first(record: dict[str, Any]) -> list[str]:
    """The trials, best first: finished ones by their final value, then the others by how many rungs they
    passed and their value at the last (stopped before running, before pending, before failed)."""
    sign = 1 if record["rules"]["mode"] == "min" else -1

    def key(stage: str) -> tuple:
        t = record["trials"][stage]
        value = _value(t)
        value = sign * value if value is not None and math.isfinite(value) else math.inf
        return {"finished": 0, "stopped": 1, "paused": 1, "running": 2}.get(t["state"], 3), -len(t["decisions"]), value

    return sorted(record["trials"], key=key)


def table(run_dir: Path, name: str, record: dict[str, Any]) -> str:
    """The sweep's trials, best first: state, the metric (final, else at the last rung) and the settings
    that differ between them."""
    rules, trials = record["rules"], record["trials"]
    varied = _varied(trials)
    body = []
    for stage in best_first(record):
        t = trials[stage]
        value = _value(t)
        flat = _flat(t["config"])
        body.append((stage, _state(run_dir, stage, t), "" if value is None else f"{value:.4g}",
                     " ".join(f"{k}={flat.get(k)}" for k in varied)))
    widths = [max(len(c), *(len(r[i]) for r in body)) for i, c in enumerate(COLUMNS)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    rungs = ", ".join(map(str, rules["rungs"])) or "none"
    head = f"sweep {name!r}: {rules['metric']} ({rules['mode']}), {rules['steps']} steps, rungs at {rungs}"
    return "\n".join([head, line(COLUMNS), line(["-" * w for w in widths]), *(line(r) for r in body)])


def _gaps(steps: Any, values: Any, t: dict[str, Any], rungs: list[int]) -> tuple[Any, Any]:
    """The curve with a gap after each rung the trial was paused at and promoted from (NaN: no line drawn)."""
    import numpy as np

    steps, values = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    for at in sorted((rungs[r] for r in t.get("promoted") or ()), reverse=True):
        cut = int(np.searchsorted(steps, at, side="right"))
        steps, values = np.insert(steps, cut, np.nan), np.insert(values, cut, np.nan)
    return steps, values


def figure(run_dir: Path, name: str, record: dict[str, Any], dirs: Mapping[str, Path] | None = None) -> Path | None:
    """``<run_dir>/sweep-<name>.png``: every trial's metric by step, the stopped ones dashed and ending in
    an x, the rungs as dotted lines (``dirs``: each trial's directory where it is not ``<run_dir>/<trial>``:
    a remote site's). None when no trial has a history here."""
    from matplotlib.figure import Figure  # object API: no pyplot state, no display

    from ...history.h5file import read_history

    rules = record["rules"]
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    drawn = 0
    for stage, t in record["trials"].items():
        histories = sorted(Path((dirs or {}).get(stage, Path(run_dir) / stage)).glob("*.h5"))
        if not histories:
            continue
        data = read_history(histories[0])
        metric = rules["metric"]
        values = data.stats.get(metric, {}).get("mean", data.metrics.get(metric))
        if values is None:
            continue
        stopped = t["state"] in ("stopped", "paused")
        steps, values = _gaps(data.steps, values, t, rules["rungs"])
        (curve,) = ax.plot(steps, values, linestyle="--" if stopped else "-", linewidth=1,
                           alpha=0.6 if stopped else 1.0, label=stage if not stopped else None)
        if stopped and len(data.steps):
            ax.plot(steps[-1], values[-1], "x", color=curve.get_color())
        drawn += 1
    if not drawn:
        return None
    for at in rules["rungs"]:
        ax.axvline(at, color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel="step", ylabel=rules["metric"],
           title=f"sweep {name!r}: dashed and x: stopped; a gap: paused there, promoted later; dotted: rungs")
    if rules["mode"] == "min" and rules["metric"] == "loss":
        ax.set_yscale("log")
    ax.legend(fontsize="small")
    path = Path(run_dir) / f"sweep-{name}.png"
    fig.savefig(path, dpi=100)
    return path
