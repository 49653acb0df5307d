"""ezpz's names and signatures on parsl-torch: ``import parsl_torch.compat.ezpz as ezpz``.

Covers what ezpz's quickstart and ``examples/minimal.py`` call (set-up, ranks,
device, wrapping, logging, timing, History), with ezpz's defaults: FSDP with
bf16 from ``wrap_model``, ``get_torch_device()`` as a device-type string,
``setup_torch``'s first positional argument as the port, ``History.finalize``
on rank 0 alone. What is not covered raises a ConfigError that says so; the
README lists both. parsl-torch's own API stays as it is.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core import log as _log
from ..core.device import get_backend
from ..core.device import get_torch_device_type as _device_type
from ..core.dist import _seed_everything, cleanup
from ..core.dist import barrier as _barrier
from ..core.dist import setup_torch as _setup_torch
from ..core.ranks import get_local_rank, get_rank
from ..core.topology import env_topology
from ..errors import ConfigError
from ..history import recorder as _recorder
from ..history import sinks as _sinks
from ..launch.schedulers import detect_scheduler

__all__ = ["History", "barrier", "cleanup", "get_dist_info", "get_hostname", "get_local_rank", "get_logger",
           "get_machine", "get_memory_metrics", "get_node_index", "get_num_nodes", "get_rank", "get_timestamp",
           "get_torch_backend", "get_torch_device", "get_torch_device_type", "get_world_size", "seed_everything",
           "setup_torch", "setup_wandb", "synchronize", "timeitlogit", "wrap_model", "wrap_model_for_ddp"]

#: ezpz's dtype names that wrap_model does not know itself
_ALIASES = {"half": "fp16", "float": "fp32"}


def _not_covered(what: str, instead: str) -> ConfigError:
    return ConfigError(f"parsl_torch.compat.ezpz: {what} is not covered; {instead}")


def setup_torch(port: str | int | None = None, seed: int | None = None, timeout: str | int | None = None,
                verbose: bool = False, *, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                context_parallel_size: int = 1, **backends: Any) -> int:
    """ezpz.setup_torch: ``port`` is the rendezvous port unless MASTER_PORT is set; returns the rank."""
    if tensor_parallel_size != 1 or pipeline_parallel_size != 1 or context_parallel_size != 1:
        raise _not_covered("setup_torch(tensor/pipeline/context_parallel_size=...)",
                           "use pt.wrap_model(model, strategy='fsdp+tp', tp_size=N) for tensor parallelism")
    if any(v is not None for v in backends.values()):
        raise _not_covered(f"setup_torch({', '.join(backends)}=...)", "set TORCH_BACKEND for the backend")
    if port is not None:
        os.environ.setdefault("MASTER_PORT", str(port))
    rank = _setup_torch(seed=seed, timeout=float(timeout) if timeout is not None else None)
    if verbose:
        get_logger("ezpz").info("%s", get_dist_info())
    return rank


def get_world_size(*, total: bool = False, in_use: bool = False) -> int:
    """Ranks in the job; ``total``: every accelerator of the job's nodes (ranks when there are none)."""
    topo = env_topology()
    if total and not in_use:
        return topo.num_nodes * _accelerators_per_node() or topo.world_size
    return topo.world_size


def get_num_nodes() -> int:
    return env_topology().num_nodes


def get_node_index() -> int:
    topo = env_topology()
    return topo.rank // max(topo.local_world_size, 1)


def get_torch_device_type(device_type: str | None = None) -> str:
    return device_type or _device_type()


def get_torch_device(*, device_type: str | None = None, as_torch_device: bool | None = None) -> Any:
    """The device type as ezpz gives it (``"cuda"``, not ``"cuda:1"``: setup_torch bound this rank's
    device, so ``.to("cuda")`` lands on it); a ``torch.device`` with ``as_torch_device=True``."""
    kind = device_type or _device_type()
    if as_torch_device:
        import torch

        return torch.device(kind)
    return kind


def get_torch_backend() -> str:
    return get_backend()


def get_hostname() -> str:
    return env_topology().hostname


def get_machine(hostname: str | None = None) -> str:
    """PARSL_TORCH_MACHINE when set (aurora, polaris, frontier, ...), else the host name."""
    return _detection().machine or hostname or get_hostname()


def get_dist_info(verbose: bool | None = None, hostfile: str | os.PathLike | None = None) -> dict[str, Any]:
    """ezpz's summary of the job: the keys its scripts read (values from parsl-torch's topology)."""
    topo = env_topology()
    device = _device_type()
    per_node = _accelerators_per_node()
    info = {
        "DEVICE": device, "DEVICE_ID": f"{device}:{get_local_rank()}", "DISTRIBUTED_BACKEND": get_backend(),
        "GPUS_PER_NODE": per_node, "HOSTS": str(list(topo.nodes)),
        "HOSTFILE": str(hostfile or os.environ.get("PBS_NODEFILE", "")), "HOSTNAME": topo.hostname,
        "LOCAL_RANK": topo.local_rank, "MACHINE": get_machine(), "NUM_NODES": topo.num_nodes,
        "NGPUS": topo.world_size, "NGPUS_AVAILABLE": topo.num_nodes * per_node or topo.world_size,
        "NODE_ID": get_node_index(), "RANK": topo.rank, "SCHEDULER": _scheduler(),
        "WORLD_SIZE_TOTAL": get_world_size(total=True), "WORLD_SIZE_IN_USE": topo.world_size,
    }
    if verbose:
        get_logger("ezpz").info("%s", json.dumps(info, indent=2))
    return info


def wrap_model(model: Any, use_fsdp: bool = True, dtype: str | None = "bfloat16", device_mesh: Any = None,
               reshard_after_forward: bool | int = True, device_id: Any = None) -> Any:
    """ezpz.wrap_model: FSDP with bf16 compute by default; ``use_fsdp=False``: DDP (dtype ignored, as ezpz)."""
    from ..core.wrap import wrap_model as _wrap

    if device_mesh is not None or reshard_after_forward is not True:
        raise _not_covered("wrap_model(device_mesh=, reshard_after_forward=)",
                           "use pt.wrap_model(model, strategy='fsdp+tp', tp_size=N)")
    if not use_fsdp:
        return _wrap(model, strategy="ddp")
    return _wrap(model, strategy="fsdp", dtype=_ALIASES.get(dtype, dtype) if isinstance(dtype, str) else dtype)


def wrap_model_for_ddp(model: Any) -> Any:
    return wrap_model(model, use_fsdp=False)


def barrier(group: Any = None, implementation: str | None = None) -> None:
    if group is not None:
        import torch.distributed as dist

        dist.barrier(group=group)
        return
    _barrier()


def synchronize(device: str | int | None = None) -> None:
    """Wait for this rank's accelerator (no-op on CPU): for honest step timings."""
    import torch

    kind = _device_type()
    backend = getattr(torch, kind, None)
    if kind != "cpu" and backend is not None and hasattr(backend, "synchronize"):
        backend.synchronize(*(() if device is None else (device,)))


def seed_everything(seed: int) -> None:
    _seed_everything(seed)


def get_logger(name: str | None = None, level: str | None = None, rank_zero_only: bool = True,
               rank: int | str | None = None, colored_logs: bool | None = True) -> Any:
    """ezpz.get_logger: rank 0 prints (``rank_zero_only=False``: every rank); colours are not made."""
    quiet = rank_zero_only and rank is not None and int(rank) != 0
    logger = _log.get_logger(name or "ezpz", level, rank_zero_only=rank_zero_only)
    if quiet:
        logger.disabled = True
    return logger


def timeitlogit(rank: int | None = None, record: bool = True, verbose: bool = False,
                prefix: str | None = None) -> Any:
    """ezpz.timeitlogit(rank=...): the call's duration, logged on rank 0 (``record``'s wandb timing is
    not made)."""
    return _log.timeitlogit(rank=0)


def get_timestamp(fstr: str | None = None) -> str:
    return datetime.datetime.now().strftime(fstr or "%Y-%m-%d-%H%M%S")


def get_memory_metrics(device: Any = None, *, reset_peak: bool = True, prefix: str = "") -> dict[str, float]:
    """This rank's accelerator memory in GiB (ezpz's four keys); ``{}`` on CPU and MPS."""
    import torch

    kind = _device_type()
    mem = getattr(torch, kind, None) if kind in ("cuda", "xpu") else None
    if mem is None or os.environ.get("EZPZ_TRACK_MEMORY", "1") == "0":
        return {}
    gib = 1024 ** 3
    out = {f"{prefix}mem_alloc": mem.memory_allocated(device) / gib,
           f"{prefix}mem_peak_alloc": mem.max_memory_allocated(device) / gib,
           f"{prefix}mem_reserved": mem.memory_reserved(device) / gib,
           f"{prefix}mem_peak_reserved": mem.max_memory_reserved(device) / gib}
    if reset_peak:
        mem.reset_peak_memory_stats(device)
    return out


def setup_wandb(project_name: str | None = None, entity: str | None = None, config: Mapping | None = None,
                outdir: str | os.PathLike | None = None, project: str | None = None, **init_kwargs: Any) -> Any:
    """A wandb run on rank 0 (WANDB_MODE=offline works), secrets in ``config`` redacted."""
    extra = {k: v for k, v in {"entity": entity, "dir": outdir, **init_kwargs}.items() if v is not None}
    return _sinks.setup_wandb(project=project or project_name, config=config, **extra)


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


class History:
    """ezpz.History on parsl-torch's History: every rank calls ``update`` (cross-rank mean, min, max,
    std every ``sync_every`` updates), ``finalize`` may run on rank 0 alone and returns an
    ``xarray.Dataset`` there (None on other ranks). The file is parsl-torch's HDF5 history."""

    def __init__(self, keys: Sequence[str] | None = None, *, report_dir: str | os.PathLike | None = None,
                 report_enabled: bool = True, jsonl_path: str | os.PathLike | None = None,
                 jsonl_overwrite: bool = False, distributed_history: bool = True, project_name: str | None = None,
                 backends: str | Sequence[str] | None = None, config: Mapping[str, Any] | None = None,
                 outdir: str | os.PathLike | None = None, tracker: Any = None) -> None:
        if tracker is not None:
            raise _not_covered("History(tracker=...)", "pass sinks through backends='wandb,csv'")
        names = backends.split(",") if isinstance(backends, str) else list(backends or [])
        unknown = [b for b in names if b.strip() not in ("wandb", "csv", "")]
        if unknown:
            raise ConfigError(f"History(backends={backends!r}): {', '.join(unknown)} not covered; use wandb, csv")
        sinks: list[Any] = [b.strip() for b in names if b.strip()]
        if jsonl_path is not None and get_rank() == 0:
            sinks.append(_JSONLSink(jsonl_path, jsonl_overwrite))
        self.outdir = Path(outdir) if outdir is not None else None
        self.report_dir = report_dir  # ezpz's markdown report is not made: the plots are beside the file
        self._history = _recorder.History(project_name or "history", config=config, sinks=sinks)
        self.keys = list(keys or [])

    @property
    def tracker(self) -> _Tracker:
        return _Tracker(self._history)

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
            raise _not_covered("finalize(warmup=...)", "drop the warmup steps when you read the dataset "
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
            from ..history.h5file import load_history

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


def _accelerators_per_node() -> int:
    kind = _device_type()
    if kind in ("cuda", "xpu"):
        import torch

        return getattr(torch, kind).device_count()
    return 0


def _detection() -> Any:
    return detect_scheduler()


def _scheduler() -> str:
    try:
        return _detection().scheduler.upper()
    except ConfigError:  # a summary never fails a script
        return "UNKNOWN"


#: ``ezpz.distributed.setup_torch`` / ``ezpz.dist.wrap_model_for_ddp``: the same names
distributed = dist = sys.modules[__name__]
