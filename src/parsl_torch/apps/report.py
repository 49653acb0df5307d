"""Summaries of finished stages: a table for the terminal, a Markdown report for the run directory."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLUMNS = ("stage", "ranks", "result", "history")


def summaries(futures: Sequence[Any]) -> list[dict[str, Any]]:
    """The results of finished stages, each labelled with its stage's name."""
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
    body = rows(summaries, run_dir)
    widths = [max(len(c), *(len(r[i]) for r in body)) for i, c in enumerate(COLUMNS)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(COLUMNS), line(["-" * w for w in widths]), *(line(r) for r in body)])


def write_report(summaries: Sequence[dict[str, Any]], run_dir: Path, title: str) -> Path:
    """``<run_dir>/report.md``: the table and every stage's plots."""
    lines = [f"# {title}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(summaries, run_dir)]
    for s in summaries:
        history = Path(s.get("history", ""))
        plots = sorted(history.with_name(f"{history.stem}-plots").glob("*.png"))
        if plots:
            lines += ["", f"## {s.get('stage')}", ""]
            lines += [f"![{p.stem}]({p.relative_to(run_dir) if p.is_relative_to(run_dir) else p})" for p in plots]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
