"""Summaries of finished stages: a table for the terminal, a Markdown report for the run directory."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError

COLUMNS = ("stage", "ranks", "result", "history")


def summaries(futures: Sequence[Any]) -> list[dict[str, Any]]:
    """The results of finished stages (their futures' values: it waits for them), each a dict
    labelled with its stage's name, for ``table`` and ``write_report``."""
    return [{**(f.result() or {}), "stage": f.stage} for f in futures]


def _result(summary: dict[str, Any]) -> str:
    keys = ("final_loss", "eval_loss", "eval_acc", "steps", "precision", "resumed_from")
    return ", ".join(f"{k}={summary[k]:.4g}" if isinstance(summary[k], float) else f"{k}={summary[k]}"
                     for k in keys if k in summary and (k != "resumed_from" or summary[k]))


def rows(summaries: Sequence[dict[str, Any]], run_dir: Path) -> list[tuple[str, ...]]:
    out = []
    for s in summaries:
        history = Path(s.get("history", ""))
        shown = history.relative_to(run_dir) if history.is_relative_to(run_dir) else history
        out.append((s.get("stage", "?"), str(s.get("world_size", "?")), _result(s), str(shown)))
    return out


def table(summaries: Sequence[dict[str, Any]], run_dir: Path) -> str:
    """A plain-text table of ``summaries`` (``summaries([...])``): stage, ranks, result, history file
    (relative to ``run_dir``), for ``print``."""
    body = rows(summaries, run_dir)
    widths = [max(len(c), *(len(r[i]) for r in body)) for i, c in enumerate(COLUMNS)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(COLUMNS), line(["-" * w for w in widths]), *(line(r) for r in body)])


def write_report(summaries: Sequence[dict[str, Any]], run_dir: Path, title: str) -> Path:
    """``<run_dir>/report.md``: what ran (site, when, versions), the table, and per stage its config,
    its constant settings as numbers, and plots of what changed; an evaluation's numbers, not plots
    of its batches."""
    histories = [_history(s) for s in summaries]  # (each file read once)
    lines = [f"# {title}", "", *_provenance(histories, run_dir), "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(summaries, run_dir)]
    for s, data in zip(summaries, histories):
        lines += ["", f"## {s.get('stage')}", "", *_stage_section(s, data, run_dir)]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _history(summary: dict[str, Any]) -> Any:
    """The stage's history file, read (None without one)."""
    from ...history.h5file import read_history

    try:
        return read_history(summary["history"]) if summary.get("history") else None
    except (ConfigError, OSError):
        return None


def _provenance(histories: Sequence[Any], run_dir: Path) -> list[str]:
    """Where and when it ran, and with what (the run's status file, the first history's versions)."""
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        status = {}
    lines = [f"Site `{status.get('site', '?')}` on host `{status.get('host', '?')}`, started "
             f"{status.get('started', '?')}, finished {status.get('finished') or '(running)'}; run directory "
             f"`{run_dir}`."]
    data = next((d for d in histories if d is not None), None)
    versions = data.attrs.get("versions") if data is not None else None
    if isinstance(versions, dict):
        lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + "."]
    return lines


def _stage_section(summary: dict[str, Any], data: Any, run_dir: Path) -> list[str]:
    import yaml

    from ...history.plots import constant, plots_dir

    lines = [f"Result: {_result(summary) or 'none recorded'}."]
    if data is None:
        return lines
    if isinstance(data.attrs.get("config"), dict):
        lines += ["", "Config:", "", "```yaml", yaml.safe_dump(data.attrs["config"], sort_keys=False).strip(), "```"]
    fixed = {m: v for m, v in ((m, constant(vals)) for m, vals in data.metrics.items()) if v is not None}
    if fixed:
        lines += ["", "The same at every step: " + ", ".join(
            f"{m} = {v:.4g}{' ' + data.units[m] if data.units.get(m, '1') != '1' else ''}" for m, v in fixed.items())
            + "."]
    if any(key.startswith("eval_") for key in summary):  # its batches are samples of one number: that number
        return lines
    plots = sorted(plots_dir(data.path).glob("*.png"))
    lines += ["", *(f"![{p.stem}]({p.relative_to(run_dir) if p.is_relative_to(run_dir) else p})" for p in plots)]
    return lines
