"""The HDF5 history file: layout, incremental writer, reader.

Layout (schema ``parsl-torch/history`` version 1)::

    /step              int64 [n]   dimension scale: the coordinate
    /<metric>          float64 [n] rank 0's values (NaN where not recorded)
    /<metric>_<stat>   float64 [n] mean|min|max|std over ranks (world size > 1)
    root attributes    schema, schema_version, stage, status (running|complete|
                       failed), start_time, end_time, steps, world_size,
                       num_nodes, nodes, hostname, device, backend, versions,
                       git_commit, config (JSON, secrets redacted), segments
                       (JSON: [first step, world size] of each run, one
                       more per resume)

Datasets are chunked, shuffled and gzip-compressed; ``step`` is attached as
their dimension, so ``xarray.open_dataset(path, engine="h5netcdf")`` indexes
them by step. A metric name with ``/`` is stored with ``.`` instead (the
original is the dataset's ``long_name``).

Crash safety: each flush writes into a copy of ``<final>.partial``
(``.partial.tmp``) and swaps it in with an atomic rename, so a process killed
at any instant, even inside HDF5, leaves a partial file that opens and holds
every row up to its last completed flush (status "running"), and nothing at
the final path; ``finish`` moves it into place atomically.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..common import settings
from ..common.diskspace import said_when_full
from ..errors import ConfigError
from .blocks import MISSING, MISSING_BITS, is_missing

SCHEMA = "parsl-torch/history"
SCHEMA_VERSION = 1
#: the file attribute ``missing``: how a step without a metric is told from a NaN the metric had
MISSING_NOTE = f"a step where a metric was not recorded holds the NaN {MISSING_BITS:#x}; another NaN was recorded"
_CHUNK = 16384
_COMPRESSION = {"compression": "gzip", "compression_opts": 1, "shuffle": True}


def default_history_path(name: str) -> Path:
    """Inside a stage, ``<its stage directory>/<name>.h5``: one file per call, never shared with another call
    or stage (and where a sweep reads a trial's history); elsewhere ``$PARSL_TORCH_RUN_DIR/outputs/<name>/
    history.h5`` (run dir: the current directory)."""
    if stage_dir := settings.STAGE_DIR.raw():
        return Path(stage_dir) / f"{name}.h5"
    return Path(settings.RUN_DIR.get()) / "outputs" / name / "history.h5"


def dataset_name(metric: str) -> str:
    return metric.replace("/", ".")


def checked_dataset_name(metric: Any, known: dict[str, str], stats: tuple[str, ...]) -> str:
    """``metric``'s dataset name, or a ConfigError when the file cannot hold it apart from the
    ``known`` metrics (metric -> dataset name) and their statistics: nothing is dropped silently."""
    if not isinstance(metric, str) or not metric.strip():
        raise ConfigError(f"metric name {metric!r}: use a non-empty string")
    if metric in known:
        return known[metric]
    name = dataset_name(metric)
    if name.startswith(".") or name == "step":
        raise ConfigError(f"metric name {metric!r} cannot be stored (it would be {name!r} in the file): rename it")
    own_stats = {f"{name}_{s}" for s in stats}
    for other, other_name in known.items():
        if other_name == name or name in {f"{other_name}_{s}" for s in stats} or other_name in own_stats:
            raise ConfigError(f"metric name {metric!r} clashes with {other!r} in the file (as {name!r} or "
                              f"its statistics _{'/_'.join(stats)}): rename one of them")
    return name


def partial_path(final: Path) -> Path:
    return final.with_name(final.name + ".partial")


class H5Writer:
    """Appends blocks of rows to a partial history file (rank 0 only)."""

    def __init__(self, final: Path, attrs: dict[str, Any], meta: dict[str, dict[str, str]]) -> None:
        self.final = final
        self.partial = partial_path(final)
        self.rows = 0
        self._meta = meta  # metric -> {"units": ..., "description": ...}
        import h5py

        self._h5py = h5py
        with self._swap(fresh=True) as f:
            f.attrs.update({"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "status": "running",
                            "steps": 0, "missing": MISSING_NOTE, **attrs})
            step = f.create_dataset("step", shape=(0,), maxshape=(None,), dtype="i8",
                                    chunks=(_CHUNK,), **_COMPRESSION)
            step.make_scale("step")

    @contextlib.contextmanager
    def _swap(self, fresh: bool = False):
        """The partial file, open for writing as a copy that replaces it only once complete."""
        work = self.partial.with_name(self.partial.name + ".tmp")
        kept = "" if fresh else f"the file keeps the history as it was before this write ({self.rows} rows)"
        if not fresh and not self.partial.exists() and self.final.exists():
            # after ``finish``, further writes work on a fresh copy of the final file
            shutil.copyfile(self.final, self.partial)
        with said_when_full(self.partial, work, kept):
            if not fresh:
                shutil.copyfile(self.partial, work)
            with self._h5py.File(work, "w" if fresh else "a") as f:
                yield f
        os.replace(work, self.partial)

    def append(self, steps: np.ndarray, values: dict[str, np.ndarray],
               stats: dict[str, dict[str, np.ndarray]], attrs: dict[str, Any]) -> None:
        """Write one block: rows for every metric, NaN for metrics absent from it."""
        n0, n1 = self.rows, self.rows + len(steps)
        columns = {dataset_name(k): (k, None, v) for k, v in values.items()}
        for k, per_stat in stats.items():
            columns.update({f"{dataset_name(k)}_{s}": (k, s, v) for s, v in per_stat.items()})
        with self._swap() as f:
            f["step"].resize((n1,))
            f["step"][n0:n1] = steps
            for name, (metric, stat, _) in columns.items():
                if name not in f:
                    self._create(f, name, metric, stat, n0)
            for name, ds in f.items():
                if name != "step":
                    ds.resize((n1,))
                    if name in columns:
                        ds[n0:n1] = columns[name][2]
            f.attrs.update({**attrs, "steps": n1})
        self.rows = n1

    def _create(self, f, name: str, metric: str, stat: str | None, rows: int) -> None:
        ds = f.create_dataset(name, shape=(rows,), maxshape=(None,), dtype="f8", chunks=(_CHUNK,),
                              fillvalue=MISSING, **_COMPRESSION)
        ds.dims[0].attach_scale(f["step"])
        if name != metric:
            ds.attrs["long_name"] = metric if stat is None else f"{metric} ({stat} over ranks)"
        if stat is not None:
            ds.attrs["statistic"] = stat
        ds.attrs.update(self._meta.get(metric, {}))

    def set_attrs(self, attrs: dict[str, Any]) -> None:
        with self._swap() as f:
            f.attrs.update(attrs)

    def finish(self, final: Path) -> Path:
        """Move the partial file to ``final`` atomically, replacing any old file."""
        staged = partial_path(final)
        try:
            if staged != self.partial:
                shutil.copyfile(self.partial, staged)  # another directory or name
            os.replace(staged, final)
        except OSError as exc:
            raise ConfigError(f"cannot write the history file {final}: {exc.strerror or exc}; "
                              f"pass another path (the history so far is kept in {self.partial})") from None
        if staged != self.partial:
            self.partial.unlink(missing_ok=True)
        self.final, self.partial = final, staged
        return final


@dataclass
class HistoryData:
    """A history file read into memory (numpy arrays), without xarray."""

    path: Path
    attrs: dict[str, Any]
    steps: np.ndarray
    metrics: dict[str, np.ndarray] = field(default_factory=dict)
    stats: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)  # metric -> its unit, where the stage gave one


def _open_checked(path: str | os.PathLike):
    import h5py

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"history file {path} does not exist")
    if not h5py.is_hdf5(path):
        raise ConfigError(f"{path} is not an HDF5 file (corrupt or another format)")
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read as HDF5: {exc}") from None
    if f.attrs.get("schema") != SCHEMA or "step" not in f:
        f.close()
        raise ConfigError(f"{path} is an HDF5 file but not a parsl-torch history "
                          f"(no schema={SCHEMA!r} attribute or no 'step' dataset)")
    return f


def read_history(path: str | os.PathLike) -> HistoryData:
    """Read a history file with h5py alone; a clear ConfigError for missing, foreign or damaged files."""
    try:
        return _read(path)
    except ConfigError:  # (a ValueError too) missing, not HDF5, not a history: said as such
        raise
    except (OSError, KeyError, ValueError) as exc:  # h5py's errors for a file damaged inside
        raise ConfigError(f"{path} is damaged and cannot be read ({type(exc).__name__}: {exc}); an earlier "
                          f"copy may be beside it (.partial)") from None


def _read(path: str | os.PathLike) -> HistoryData:
    with _open_checked(path) as f:
        attrs = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in f.attrs.items()}
        for key in ("config", "versions", "nodes", "segments"):
            if isinstance(attrs.get(key), str):
                attrs[key] = json.loads(attrs[key])
        data = HistoryData(Path(path), attrs, f["step"][:])
        stat_names = {name for name, ds in f.items() if "statistic" in ds.attrs}
        for name, ds in f.items():
            if name == "step" or name in stat_names:
                continue
            metric = ds.attrs.get("long_name", name)
            data.metrics[metric] = ds[:]
            if "units" in ds.attrs:
                data.units[metric] = str(ds.attrs["units"])
            stats = {s: f[f"{name}_{s}"][:] for s in ("mean", "min", "max", "std") if f"{name}_{s}" in stat_names}
            if stats:
                data.stats[metric] = stats
    return data


def load_history(path: str | os.PathLike):
    """The history as an ``xarray.Dataset`` indexed by ``step`` (needs xarray, h5netcdf)."""
    _open_checked(path).close()
    try:
        import xarray as xr
    except ImportError:
        raise ConfigError("load_history needs xarray and h5netcdf: pip install 'parsl-torch[history]' "
                          "(or use parsl_torch.read_history, which needs h5py only)") from None
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        return ds.load()


def summarize(data: HistoryData) -> dict[str, dict[str, Any]]:
    """Per metric: last (NaN if the last recorded value is), min, max, mean of the finite values (of the
    mean over ranks when there are several ranks: rank 0 may lack a metric), how many recorded steps are
    not finite, and which series that is."""
    out: dict[str, dict[str, Any]] = {}
    for metric, values in data.metrics.items():
        stats = data.stats.get(metric)
        series, source = (stats["mean"], "mean over ranks") if stats else (values, "rank 0")
        finite = series[np.isfinite(series)]
        told = "missing" in data.attrs  # (such a file tells a step without the metric from a NaN it had)
        recorded = series[(~is_missing(values) | np.isfinite(series)) if told else ~np.isnan(series)]
        nan = float("nan")
        out[metric] = {"last": float(recorded[-1]) if recorded.size else nan,
                       "min": float(finite.min()) if finite.size else nan,
                       "max": float(finite.max()) if finite.size else nan,
                       "mean": float(finite.mean()) if finite.size else nan,
                       "not finite": int((~np.isfinite(recorded)).sum()), "of": source}
    return out


def check_dir(path: Path, where: str, partial: Path | None = None) -> None:
    kept = f" (the history so far is kept in {partial})" if partial else ""
    parent = path.parent
    if not parent.is_dir():
        raise ConfigError(f"{where}: directory {parent} for {path.name} does not exist: create it "
                          f"or pass another path{kept}")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"{where}: directory {parent} is not writable: pass another path{kept}")
