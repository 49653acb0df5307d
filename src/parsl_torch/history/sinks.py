"""Where metrics go besides the history file: wandb, CSV, or nowhere.

A sink has ``log(step, metrics)``, ``flush()`` and ``close()``. History calls
them on rank 0 only. A sink that raises is reported once as a warning and then
switched off: a full disk or a dead wandb service never stops training.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ..common.metadata import redact
from ..core.log import get_logger
from ..core.ranks import get_rank
from ..errors import ConfigError


class Sink(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class CSVSink:
    """One row per step, appended (never rewritten). Columns are fixed by the
    first row; metrics that appear later are reported once and left out (the
    history file has them all)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._file = None
        self._writer: Any = None
        self._columns: list[str] = []
        self._dropped: set[str] = set()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            new = not self.path.exists() or self.path.stat().st_size == 0
            self._file = open(self.path, "a", newline="")
            self._columns = ["step", *metrics]
            self._writer = csv.writer(self._file)
            if new:
                self._writer.writerow(self._columns)
        if extra := metrics.keys() - set(self._columns) - self._dropped:
            self._dropped |= extra
            get_logger(__name__).warning(
                "CSV %s: new metric(s) %s after the header was written are left out of the CSV "
                "(they are in the history file)", self.path, sorted(extra))
        self._writer.writerow([step, *(_cell(metrics.get(c)) for c in self._columns[1:])])

    def flush(self) -> None:
        if self._file:
            self._file.flush()

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = self._writer = None


def _cell(value: float | None) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else repr(value)


class WandbSink:
    """Logs to a wandb run (``WANDB_MODE=offline`` works without network)."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.run.finish()


def setup_wandb(project: str | None = None, name: str | None = None,
                config: Mapping[str, Any] | None = None, **init_kwargs: Any):
    """Start a wandb run on rank 0 (None elsewhere), as ezpz does.

    Respects WANDB_MODE (``offline`` needs no network or key); the config is
    logged with secrets redacted. Returns the run, or None when wandb is not
    installed (with a warning) or on ranks other than 0.
    """
    if get_rank() != 0:
        return None
    try:
        import wandb
    except ImportError:
        get_logger(__name__).warning(
            "wandb is not installed: pip install 'parsl-torch[wandb]'; metrics go to the history file only")
        return None
    return wandb.init(project=project or os.environ.get("WANDB_PROJECT", "parsl-torch"), name=name,
                      config=redact(dict(config or {})), **init_kwargs)


class SafeSinks:
    """Calls every sink, turning a failing one off after one warning."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = list(sinks)

    def _call(self, method: str, *args: Any) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, method)(*args)
            except Exception as exc:  # noqa: BLE001 - a sink must never stop training
                self.sinks.remove(sink)
                get_logger(__name__).warning(
                    "%s.%s failed (%s: %s); this sink is switched off for the rest of the run",
                    type(sink).__name__, method, type(exc).__name__, exc)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._call("log", step, metrics)

    def flush(self) -> None:
        self._call("flush")

    def close(self) -> None:
        self._call("close")
        self.sinks.clear()


def make_sinks(sinks: Iterable[Any], csv_path: Path, name: str, config: Any) -> SafeSinks:
    """History's ``sinks`` by name ("csv" beside the history file, "wandb", "none") or as objects."""
    made = []
    for sink in sinks:
        if sink == "csv":
            made.append(CSVSink(csv_path))
        elif sink == "wandb":
            run = setup_wandb(project=os.environ.get("WANDB_PROJECT"), name=name, config=config)
            if run is not None:
                made.append(WandbSink(run))
        elif sink in ("none", None):
            continue
        elif isinstance(sink, str):
            raise ConfigError(f"sink {sink!r} is unknown: use 'csv', 'wandb', 'none' or a Sink object")
        else:
            made.append(sink)
    return SafeSinks(made)
