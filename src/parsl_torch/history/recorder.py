"""History: per-step metrics that cost next to nothing to record.

``update`` appends to per-metric Python lists on this rank: no collective, no file I/O, no logging
set-up; a tensor on its device is read every ``read_every`` steps (``deferred``), not waited for. Every
``sync_every`` updates (and at ``finalize``) the rows since the last sync become a numpy block and the
ranks compute mean/min/max/std per step and metric in a few batched collectives (``stats``). Rank 0
appends its blocks to the history file's partial copy at most every ``flush_every`` seconds (file I/O is
local to rank 0: no agreement between ranks). ``finalize`` moves that file into place, "complete".

All ranks must call ``update`` equally often and all must call ``finalize`` (both contain the same
collectives), as with any collective code; or rank 0 alone calls ``finalize(ranks="this")``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..common import settings, stagedir
from ..common.metadata import git_commit, package_versions, redact, utc_now
from ..observe.recorder import unobserved
from ..observe.native import without_observer
from ..core.device import get_torch_device_type
from ..core.deadline import await_ruling, progressed, sweep_rungs
from ..core.dist import collective_timeout
from ..core.log import get_logger
from ..core.ranks import get_rank, process_group
from ..core.topology import env_topology
from ..errors import ConfigError
from .blocks import MISSING, Block, as_float, as_step
from .deferred import Deferred, is_tensor
from .h5file import H5Writer, check_dir, checked_dataset_name, default_history_path, partial_path, read_history
from .plots import plot_history
from .sinks import make_sinks
from .stats import STATS, RankComm, cross_rank_stats, distributed_world, union_keys

#: beside the history file: its progress, for parsl-torch run / status (rank 0, at most every PROGRESS_S)
PROGRESS_S = 2.0


class History:
    """Records metrics per step; writes one HDF5 history file per stage.

    ``name``: the stage name (file attribute, default file location). ``path``: where ``finalize`` puts
    the file (else its argument, else ``default_history_path(name)``: inside a stage, the stage's own
    directory). ``sync_every``: updates between cross-rank syncs (0: only at finalize). ``flush_every``: seconds between writes of
    the partial file, checked at syncs (0: at every sync); a crash loses at
    most that much history. ``read_every``: steps between two reads of the
    tensors passed to ``update`` (a loss on its GPU: copied to the host without
    waiting, read at steps that are multiples of it and before every sync; 1:
    read at once, as ``.item()``). ``config``: stored as JSON with
    secrets redacted. ``units``/``descriptions``: per-metric attributes.
    ``sinks``: "csv", "wandb" or Sink objects, fed on rank 0. ``on_sync``: called on
    every rank with each synced Block (its rows and their cross-rank statistics).
    """

    def __init__(self, name: str = "history", *, path: str | os.PathLike | None = None,
                 sync_every: int = 100, flush_every: float = 30.0, read_every: int = 1,
                 config: Mapping[str, Any] | None = None, units: Mapping[str, str] | None = None,
                 descriptions: Mapping[str, str] | None = None, sinks: Iterable[Any] = (),
                 on_sync: Callable[[Block], None] | None = None) -> None:
        if not isinstance(sync_every, int) or sync_every < 0:
            raise ConfigError(f"sync_every={sync_every!r}: use a non-negative int (0: sync at finalize only)")
        if not isinstance(read_every, int) or read_every < 1:
            raise ConfigError(f"read_every={read_every!r}: use an int >= 1 (1: tensors are read at each update)")
        self.name, self.path = name, Path(path).absolute() if path is not None else None
        self.sync_every, self.flush_every, self.read_every = sync_every, flush_every, read_every
        self._deferred = Deferred()
        self._unlogged: list[tuple[int, dict[str, tuple[list[float], int]]]] = []  # read late, for the sinks
        self._on_sync = on_sync
        self.config = dict(config or {})
        self._meta = {k: {"units": v} for k, v in (units or {}).items()}
        for k, v in (descriptions or {}).items():
            self._meta.setdefault(k, {})["description"] = v
        self._rank = get_rank()
        self._start = utc_now()
        self._last_progress = 0.0
        self._keys: dict[str, str] = {}  # metric -> its dataset name in the file
        self._unreported: Block | None = None
        self._steps: list[int] = []
        self._cols: dict[str, list[float]] = {}
        self._next_step = 0
        self._writer: Any = None
        self._comm: RankComm | None = None  # made at the first cross-rank sync
        self._blocks: list[Block] = []  # synced, not yet on disk
        self._last_flush = time.monotonic()
        self._finalized: Path | None = None
        self._segments: list[list[int]] = []  # [first step, world size] of each run that recorded rows
        self._sinks = make_sinks(sinks, self._target(None).with_suffix(".csv"), self.name, self.config) \
            if self._rank == 0 else None
        self._rungs = sweep_rungs()  # (a sweep's trial: judged at these steps from this history)

    # -- recording ---------------------------------------------------------
    def update(self, metrics: Mapping[str, Any], step: int | None = None) -> str:
        """Record one step's metrics on this rank; returns ``"step=3 loss=0.25 ..."``. A ``"step"``
        entry (or ``step``) sets the step, else steps count up from the last one. Tensors, numpy and
        Python scalars are accepted; NaN and inf are recorded as they are. With ``read_every`` > 1 a
        tensor is read later (``loss=…`` in the line until then)."""
        cols, n = self._cols, len(self._steps)
        step, recorded, shown, late = self._add_row(metrics, step, n)
        step = self._next_step if step is None else step
        self._steps.append(step)
        self._next_step = step + 1
        if late or self._deferred:  # (tensors on a device: the line shows what is read by now)
            unread = {k for k, _ in self._defer(step, n, late)}
            shown = [part or (f"{k}=…" if k in unread else f"{k}={cols[k][n]:.6g}") for k, part in zip(recorded, shown)]
        if self._sinks is not None and self._sinks.sinks:  # (rank 0: the rows once every value up to them is read)
            self._unlogged.append((step, {k: (cols[k], n) for k in recorded}))
            self._unlogged = self._unlogged if self._deferred else Deferred.to_sinks(self._sinks, self._unlogged)
        if self._rungs:
            self._sweep_row(step, n)
        if self.sync_every and len(self._steps) >= self.sync_every:  # (none pending after a rung's sync)
            self.sync()
        return f"step={step} {' '.join(shown)}"  # type: ignore[arg-type]

    def _sweep_row(self, step: int, n: int) -> None:
        """A sweep's trial: at a rung, the rows on disk for the sweep to judge and its ruling awaited. The first
        row since the last sync tells how far the attempt got (a resumed one: past its judged rungs)."""
        if n == 0:
            progressed(step)
        if step + 1 in self._rungs:
            self.sync()
            self.flush()
            await_ruling(step + 1)

    def _add_row(self, metrics: Mapping[str, Any], step: int | None, n: int
                 ) -> tuple[int | None, list[str], list[str | None], list[tuple[str, Any]]]:
        """Row ``n``'s values into the columns (a metric recorded before and missing now: not recorded; a
        bad entry leaves nothing behind): the step it names, the metrics recorded, each one's part of the
        line (None: a tensor read later), the tensors read later."""
        cols, created = self._cols, None
        late: list[tuple[str, Any]] = []
        recorded: list[str] = []
        shown: list[str | None] = []
        try:
            for k, v in metrics.items():
                if k == "step":
                    step = as_step(v) if step is None else step
                    continue
                if type(v) is not float:
                    if self.read_every > 1 and is_tensor(v):
                        Deferred.check(k, v)
                        late.append((k, v))
                        v = MISSING
                    else:
                        v = as_float(k, v)
                col = cols.get(k)
                if col is None:
                    if k not in self._keys:  # a name the file can hold, not clashing with another
                        self._keys[k] = checked_dataset_name(k, self._keys, STATS)
                    col = cols[k] = [MISSING] * n
                    created = [*(created or ()), k]
                col.append(v)
                recorded.append(k)
                shown.append(None if late and late[-1][0] == k else f"{k}={v:.6g}")
            if step is not None and type(step) is not int:
                step = as_step(step)
        except ConfigError:  # a bad entry must not leave half a row behind
            for k in created or ():
                del cols[k]
            for col in cols.values():
                del col[n:]
            raise
        if len(cols) != len(recorded):  # a metric recorded before is missing now
            for col in cols.values():
                if len(col) == n:
                    col.append(MISSING)
        return step, recorded, shown, late

    def _defer(self, step: int, n: int, late: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Row ``n``'s tensors, read later (all unread ones now, at a multiple of read_every); those unread."""
        for k, v in late:
            self._deferred.add(k, v, self._cols[k], n, step)
        if step % self.read_every == 0 or step - (self._deferred.first_step or 0) >= self.read_every:
            self._deferred.read()
        return late if self._deferred else []

    def sync(self) -> None:
        """Cross-rank statistics of the pending rows; rank 0 appends them to the file. Collective: every
        rank must call it (``update`` and ``finalize`` do)."""
        block = self._take_pending()
        if distributed_world() > 1:
            rows = len(block.steps)
            self._comm = self._comm or RankComm()
            union, max_rows = union_keys(self._comm, block.keys, rows)
            full = np.full((len(union), max_rows), MISSING)
            full[[union.index(k) for k in block.keys], :rows] = block.values
            result = cross_rank_stats(self._comm, full)
            block = Block(block.steps, tuple(union), full[:, :rows], {s: result[s][:, :rows] for s in STATS})
            if self._rank == 0 and rows < max_rows:
                get_logger("parsl_torch.history").warning(
                    "history %r: other ranks recorded %d more step(s) than rank 0 since the last "
                    "sync; the file keeps rank 0's steps", self.name, max_rows - rows)
        if self._on_sync is not None:
            self._on_sync(block)
        if self._rank == 0:
            self._blocks.append(block)
            self._progress(block)
            if time.monotonic() - self._last_flush >= self.flush_every:
                self.flush()

    def _progress(self, block: Block, force: bool = False) -> None:
        """Rank 0, at a sync, at most every PROGRESS_S (and at finalize): ``<history>.progress.json``
        (step, total, the loss or first metric) for ``parsl-torch run`` and ``status``. No collective."""
        now = time.time()
        if not len(block.steps) or (now - self._last_progress < PROGRESS_S and not force):
            self._unreported = block if len(block.steps) else self._unreported
            return
        self._unreported = None
        self._last_progress = now
        metric = "loss" if "loss" in block.keys else (block.keys[0] if block.keys else None)
        values = block.stats.get("mean", block.values) if block.stats else block.values
        total = self.config.get("steps")  # the built-in stages record their config
        mfu = float(values[block.keys.index("mfu"), -1]) if "mfu" in block.keys else None
        progress = stagedir.ProgressRecord(int(block.steps[-1]), total if isinstance(total, int) else None, metric,
                                           float(values[block.keys.index(metric), -1]) if metric else None, now,
                                           mfu if mfu is not None and math.isfinite(mfu) else None)
        with contextlib.suppress(OSError):
            stagedir.write(str(self._target(None)) + stagedir.PROGRESS_SUFFIX, progress)

    def _take_pending(self) -> Block:
        """The rows recorded since the last sync as one block (their tensors read); starts a new one."""
        self._deferred.read()
        self._unlogged = Deferred.to_sinks(self._sinks, self._unlogged)
        keys, rows = tuple(self._cols), len(self._steps)
        values = np.array([self._cols[k] for k in keys], dtype=np.float64).reshape(len(keys), rows)
        block = Block(np.array(self._steps, dtype=np.int64), keys, values, {})
        self._steps, self._cols = [], {}
        return block

    def flush(self) -> None:
        """Rank 0: write the synced blocks to the partial file (no collectives)."""
        if self._rank != 0:
            return
        if self._blocks or self._writer is None:
            self._write(*Block.merge(self._blocks))
            self._blocks = []
        if self._sinks is not None:
            self._sinks.flush()
        self._last_flush = time.monotonic()

    # -- output ------------------------------------------------------------
    def _target(self, path: str | os.PathLike | None) -> Path:
        return (Path(path) if path is not None else self.path or default_history_path(self.name)).absolute()

    def _write(self, steps: np.ndarray, values: dict[str, np.ndarray], stats: dict) -> None:
        if self._writer is None:
            target = self._target(None)
            if self.path is None:
                target.parent.mkdir(parents=True, exist_ok=True)  # our default: ours to create
            check_dir(target, where="the history's partial file")
            if not self._segments:  # not resumed: this run's rows start here
                self._segments = [[int(steps[0]) if len(steps) else 0, env_topology().world_size]]
            self._writer = H5Writer(target, self._file_attrs(), self._meta)
        self._writer.append(steps, values, stats, {})

    def _file_attrs(self) -> dict[str, Any]:
        topo = env_topology()
        group = process_group()
        return {
            "stage": self.name, "start_time": self._start, "end_time": "",
            "world_size": topo.world_size, "num_nodes": topo.num_nodes,
            "nodes": json.dumps(list(topo.nodes)), "hostname": topo.hostname,
            "device": get_torch_device_type(), "backend": group.get_backend() if group else "none",
            "versions": json.dumps(package_versions()), "git_commit": _git_commit(),
            "config": json.dumps(redact(self.config), default=str),
            "segments": json.dumps(self._segments),
        }

    @property
    def segments(self) -> list[list[int]]:
        """[first step, world size] of each run whose rows the file holds (rank 0): one, or one
        more per resume (a stage resumed on fewer nodes after a node loss shows it here)."""
        return [list(s) for s in self._segments]

    def finalize(self, path: str | os.PathLike | None = None, *, plot: bool | None = None, ranks: str = "all") -> Path:
        """Sync the last rows and put the complete file at ``path``; returns the path. ``ranks="all"``
        (default): collective, every rank calls it; rank 0 writes, every rank returns the same path. If the
        other ranks do not join within the collective timeout (settings.TIMEOUT), an error says so instead of
        a hang. ``ranks="this"``: rank 0 alone (ezpz's habit: ``if rank == 0: history.finalize()``); the rows
        since the last sync are rank 0's own (attribute ``rank0_only_from_step``), other ranks return at
        once. Plots (PNG per metric, beside the file) are made when matplotlib is installed, unless
        ``plot=False`` (default: PARSL_TORCH_PLOTS)."""
        if ranks not in ("all", "this"):
            raise ConfigError(f"History.finalize(ranks={ranks!r}): use 'all' (every rank calls it) or 'this' "
                              f"(rank 0 alone)")
        final = self._target(path)
        if ranks == "this":
            if self._rank == 0:
                self._finalize_alone()
        else:
            self._join_for_finalize()
            self.sync()
        if self._rank == 0:
            if self._unreported is not None:  # the last steps, whatever the throttle said
                self._progress(self._unreported, force=True)
            self.flush()
            staged = self._writer.partial
            check_dir(final, where="finalize", partial=staged)
            self._writer.set_attrs({"status": "complete", "end_time": utc_now()})
            self._writer.finish(final)
            if self.path is None and path is not None:  # drop the default dir we made, if empty
                with contextlib.suppress(OSError):
                    staged.parent.rmdir()
            if self._sinks is not None:
                self._sinks.close()
            if settings.PLOTS.get() if plot is None else plot:
                self._plot(final)
        self._finalized = final
        return final

    def _join_for_finalize(self) -> None:
        """All ranks meet before finalize's collectives: a finalize on rank 0 alone fails here,
        within the timeout and saying why (not gloo's "Connection closed by peer", or an MPI spin)."""
        if distributed_world() == 1:
            return
        try:
            self._comm = self._comm or RankComm()
            self._comm.join(collective_timeout())
        except Exception as exc:  # noqa: BLE001 - gloo, NCCL and MPI each raise their own kind
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"History.finalize on rank {self._rank}: not every rank called it ({first}); every "
                              f"rank must call finalize, or call finalize(path, ranks='this') on rank 0 "
                              f"alone") from exc

    def _finalize_alone(self) -> None:
        """Rank 0's rows since the last sync, as its own: mean/min/max are its values, std NaN."""
        block = self._take_pending()
        if len(block.steps):
            own = {"mean": block.values, "min": block.values, "max": block.values,
                   "std": np.full_like(block.values, np.nan)}
            self._blocks.append(Block(block.steps, block.keys, block.values, own))
            self._progress(self._blocks[-1])
            self.flush()
            self._writer.set_attrs({"rank0_only_from_step": int(block.steps[0])})

    def _plot(self, path: Path) -> None:
        try:
            plot_history(path)
        except ImportError:
            get_logger("parsl_torch.history").info("no plots: pip install 'parsl-torch[history]' for matplotlib")
        except Exception as exc:  # noqa: BLE001 - plots are a convenience
            get_logger("parsl_torch.history").warning("plotting %s failed: %s", path, exc)

    def resume(self, before_step: int) -> None:
        """Start from an earlier attempt's file: keep its rows with step < ``before_step``. For a run
        resumed from a checkpoint taken at ``before_step``: reads ``<path>.partial`` (else ``<path>``) on
        rank 0; later steps are recorded anew, so none is lost or duplicated. No collectives."""
        if self._rank != 0:
            return
        target = self._target(None)
        source = next((p for p in (partial_path(target), target) if p.exists()), None)
        if source is None:
            return
        data = read_history(source)
        keep = data.steps < before_step
        earlier = data.attrs.get("segments") or [[int(data.steps[0]) if len(data.steps) else 0,
                                                  data.attrs.get("world_size")]]
        self._segments = [s for s in earlier if s[0] < before_step] + [[before_step, env_topology().world_size]]
        keys = tuple(data.metrics)
        values = np.array([data.metrics[k][keep] for k in keys]).reshape(len(keys), int(keep.sum()))
        stats = {}
        if data.stats and all(k in data.stats for k in keys):
            stats = {s: np.array([data.stats[k][s][keep] for k in keys]).reshape(values.shape) for s in STATS}
        self._blocks.insert(0, Block(data.steps[keep], keys, values, stats))

    def mark_failed(self) -> None:
        """Keep what this rank has as a partial file with status "failed" (no collectives)."""
        if self._deferred and (lost := self._deferred.read_or_lose()):
            get_logger("parsl_torch.history").warning("history %r: the values not read when it failed are left "
                                                      "out (the device did not give them: %s)", self.name, lost)
        if self._rank != 0:
            return
        if self._steps:
            self._blocks.append(self._take_pending())
        if self._blocks:
            self.flush()
        if self._writer is not None:
            self._writer.set_attrs({"status": "failed"})
            get_logger("parsl_torch.history").warning(
                "history %r kept up to the failure in %s", self.name, self._writer.partial)

    def __enter__(self) -> History:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.mark_failed()
        elif self._finalized is None:
            self.finalize()


def _git_commit() -> str:
    """The commit of the code the stage runs: parsl-torch's own look (its ``git`` not observed), not the
    stage's reads."""
    with unobserved():
        return git_commit(without_observer(os.environ))
