"""``ezpz.distributed`` (and ``ezpz.dist``): set-up, ranks, device, wrapping, wandb, with ezpz's
signatures and behaviour (ezpz v0.26.1) on parsl-torch's core. Where ezpz's behaviour would hide
a mistake here, ours stays and the README's table says why."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ... import sites
from ...common import settings
from ...core.device import get_backend
from ...core.device import get_torch_device_type as _device_type
from ...core.dist import _seed_everything, cleanup
from ...core.dist import barrier as _barrier
from ...core.dist import setup_torch as _setup_torch
from ...core.log import timeitlogit as _timeitlogit
from ...core.ranks import get_local_rank, get_rank
from ...core.topology import env_topology
from ...errors import ConfigError
from ...history import sinks as _sinks
from ...launch.schedulers import detect_scheduler
from .log import get_logger
from .utils import not_covered

__all__ = ["barrier", "cleanup", "get_dist_info", "get_hostname", "get_local_rank", "get_machine",
           "get_node_index", "get_num_nodes", "get_rank", "get_torch_backend", "get_torch_device",
           "get_torch_device_type", "get_world_size", "query_environment", "seed_everything", "setup_torch",
           "setup_wandb", "synchronize", "timeitlogit", "verify_wandb", "wrap_model", "wrap_model_for_ddp"]

#: ezpz's device types (an explicit other one is a ValueError, as in ezpz)
DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps")
#: ezpz's names of the machines parsl-torch's machine records know
MACHINE_NAMES = {"aurora": "Aurora", "sunspot": "SunSpot", "polaris": "Polaris", "frontier": "Frontier",
                 "perlmutter": "Perlmutter"}
#: what ezpz's dtype names are in wrap_model's
_ALIASES = {"half": "fp16", "float": "fp32"}


def setup_torch(port: str | int | None = None, seed: int | None = None, timeout: str | int | None = None,
                verbose: bool = False, *, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                context_parallel_size: int = 1, device_id: int | None = None, **backends: Any) -> int:
    """ezpz.setup_torch: returns the rank and exports RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT (scripts read them afterwards); ``seed`` seeds this rank with
    ``seed * (rank + 1) * (local_rank + 1)``. ``port`` is the rendezvous port unless MASTER_PORT is set."""
    if tensor_parallel_size != 1 or pipeline_parallel_size != 1 or context_parallel_size != 1:
        raise not_covered("setup_torch(tensor/pipeline/context_parallel_size=...)",
                          "use pt.wrap_model(model, strategy='fsdp+tp', tp_size=N) for tensor parallelism")
    if any(v is not None for v in backends.values()):
        raise not_covered(f"setup_torch({', '.join(backends)}=...)", "set TORCH_BACKEND for the backend")
    if device_id is not None:
        raise not_covered("setup_torch(device_id=...)", "each rank is bound to its local rank's device "
                                                        "(PARSL_TORCH_GPU_ORDER reorders them)")
    if port is not None:
        os.environ.setdefault("MASTER_PORT", str(port))
    rank = _setup_torch(timeout=float(timeout) if timeout is not None else None)
    topo = env_topology()
    store = _rendezvous_store()
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(topo.local_rank), "WORLD_SIZE": str(topo.world_size),
                       "LOCAL_WORLD_SIZE": str(topo.local_world_size)})
    for key, value in (("MASTER_ADDR", getattr(store, "host", None) or topo.master_addr),
                       ("MASTER_PORT", getattr(store, "port", None) or topo.master_port)):
        if value and not os.environ.get(key):
            os.environ[key] = str(value)
    if seed is not None:
        seed_everything(seed * (rank + 1) * (topo.local_rank + 1))
    if verbose:
        get_logger("ezpz").info("%s", get_dist_info())
    return rank


def _rendezvous_store() -> Any:
    """The process group's TCPStore (its host and port are the rendezvous), or None."""
    import torch.distributed as dist

    try:
        return getattr(dist.distributed_c10d._get_default_store(), "underlying_store", None)
    except (RuntimeError, ValueError, AttributeError):  # no process group (one process), or torch's internals moved
        return None


def get_world_size(*, total: bool = False, in_use: bool = False) -> int:
    """Ranks in the job; ``total``: every accelerator of the job's nodes (ranks when there are none)."""
    topo = env_topology()
    if total and not in_use:
        return topo.num_nodes * _accelerators_per_node() or topo.world_size
    return topo.world_size


def get_num_nodes(hostfile: str | os.PathLike | None = None) -> int:
    """SLURM_NNODES, else the hosts in ``hostfile`` (else PBS_NODEFILE, HOSTFILE), else the ranks' nodes.
    Unlike ezpz, no ``./hostfile`` is written."""
    if os.environ.get("SLURM_NNODES", "").isdigit():
        return int(os.environ["SLURM_NNODES"])
    for candidate in (hostfile, os.environ.get("PBS_NODEFILE"), os.environ.get("HOSTFILE")):
        if candidate and Path(candidate).is_file():
            hosts = {line.strip() for line in Path(candidate).read_text().splitlines() if line.strip()}
            return max(len(hosts), 1)
    return env_topology().num_nodes


def get_node_index() -> int:
    topo = env_topology()
    return topo.rank // max(topo.local_world_size, 1)


def get_torch_device_type(device_type: str | None = None) -> str:
    """``device_type`` if given (one of ezpz's four, else ValueError), else this rank's."""
    if device_type is not None:
        if device_type.lower() not in DEVICE_TYPES:
            raise ValueError(f"unsupported device type {device_type!r}: use one of {', '.join(DEVICE_TYPES)}")
        return device_type.lower()
    return _device_type()


def get_torch_device(*, device_type: str | None = None, as_torch_device: bool | None = None) -> Any:
    """TORCH_DEVICE as given (``"cuda:2"`` keeps its index, and wins over ``device_type``, as ezpz),
    else the device type (``"cuda"``: setup_torch bound this rank's device, so ``.to("cuda")`` lands
    on it); a ``torch.device`` with ``as_torch_device=True``."""
    forced = (settings.DEVICE.get() or "").lower()
    kind = forced if forced and forced.split(":")[0] in DEVICE_TYPES else get_torch_device_type(device_type)
    if as_torch_device:
        import torch

        return torch.device(kind)
    return kind


def get_torch_backend() -> str:
    return get_backend()


def get_hostname() -> str:
    return env_topology().hostname


def get_machine(hostname: str | None = None) -> str:
    """ezpz's machine name ("Aurora", "Polaris", "SunSpot", "Frontier", "Perlmutter") of this host (or
    ``hostname``), from the site files' host names and PARSL_TORCH_MACHINE; else the host name, as ezpz."""
    try:
        machine = sites.detect_job(hostname=hostname).machine
    except ConfigError:
        machine = None
    return MACHINE_NAMES.get(machine or "", machine) or hostname or get_hostname()


def get_dist_info(verbose: bool | None = None, hostfile: str | os.PathLike | None = None) -> dict[str, Any]:
    """ezpz's summary of the job: the keys its scripts read (values from parsl-torch's topology)."""
    topo = env_topology()
    device = _device_type()
    per_node = _accelerators_per_node()
    info = {
        "DEVICE": device, "DEVICE_ID": f"{device}:{get_local_rank()}", "DISTRIBUTED_BACKEND": get_backend(),
        "GPUS_PER_NODE": per_node, "HOSTS": str(list(topo.nodes)),
        "HOSTFILE": str(hostfile or os.environ.get("PBS_NODEFILE", "")), "HOSTNAME": topo.hostname,
        "LOCAL_RANK": topo.local_rank, "MACHINE": get_machine(), "NUM_NODES": get_num_nodes(hostfile),
        "NGPUS": topo.world_size, "NGPUS_AVAILABLE": topo.num_nodes * per_node or topo.world_size,
        "NODE_ID": get_node_index(), "RANK": topo.rank, "SCHEDULER": scheduler_name(),
        "WORLD_SIZE_TOTAL": get_world_size(total=True), "WORLD_SIZE_IN_USE": topo.world_size,
        "world_size": topo.world_size,
    }
    if verbose:
        get_logger("ezpz").info("%s", json.dumps(info, indent=2))
    return info


def wrap_model(model: Any, use_fsdp: bool = True, dtype: str | None = "bfloat16", device_mesh: Any = None,
               reshard_after_forward: bool | int = True, device_id: Any = None) -> Any:
    """ezpz.wrap_model: FSDP with bf16 compute by default; ``use_fsdp=False``: DDP (dtype ignored, as ezpz)."""
    from ...core.wrap import wrap_model as _wrap

    if device_mesh is not None or reshard_after_forward is not True:
        raise not_covered("wrap_model(device_mesh=, reshard_after_forward=)",
                          "use pt.wrap_model(model, strategy='fsdp+tp', tp_size=N)")
    if not use_fsdp:
        return _wrap(model, strategy="ddp")
    return _wrap(model, strategy="fsdp", dtype=_ALIASES.get(dtype, dtype) if isinstance(dtype, str) else dtype)


def wrap_model_for_ddp(model: Any) -> Any:
    return wrap_model(model, use_fsdp=False)


#: ezpz's barrier implementations
BARRIERS = ("mpi", "torch")


def barrier(group: Any = None, implementation: str | None = None) -> None:
    """``implementation``: None or "mpi" (MPI's barrier when the ranks came from an MPI launcher,
    else the process group's), "torch" (the process group's; a no-op without one)."""
    kind = implementation.lower() if isinstance(implementation, str) else implementation
    if kind not in (None, *BARRIERS):
        raise ValueError(f"Unsupported barrier implementation: {implementation!r} (use None, 'mpi' or 'torch')")
    if kind != "torch" and group is None and _mpi_barrier():
        return
    import torch.distributed as dist

    if group is not None and dist.is_initialized():
        dist.barrier(group=group)
    else:
        _barrier()


def _mpi_barrier() -> bool:
    if env_topology().rank_source not in ("pals", "mpich", "openmpi") or "mpi4py" not in sys.modules:
        return False
    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()
    return True


def synchronize(device: str | int | None = None) -> None:
    """Wait for this rank's accelerator (no-op on CPU): for honest step timings."""
    import torch

    kind = _device_type()
    backend = getattr(torch, kind, None)
    if kind != "cpu" and backend is not None and hasattr(backend, "synchronize"):
        backend.synchronize(*(() if device is None else (device,)))


def seed_everything(seed: int) -> None:
    """random, PYTHONHASHSEED (for the processes this one starts), numpy, torch and the accelerator."""
    import torch

    os.environ["PYTHONHASHSEED"] = str(seed)
    _seed_everything(seed)
    for kind in ("cuda", "xpu"):
        backend = getattr(torch, kind, None)
        if backend is not None and backend.is_available():
            backend.manual_seed(seed)


def timeitlogit(rank: int | None = None, record: bool = True, verbose: bool = False,
                prefix: str | None = None) -> Any:
    """ezpz.timeitlogit(rank=...): the call's duration, logged on rank 0 (``record``'s wandb timing is
    not made)."""
    return _timeitlogit(rank=0)


def query_environment() -> dict[str, int]:
    """ezpz.query_environment: ``world_size``, ``rank`` and ``local_rank``, from the torchrun variables when all
    three are set, else as this process's rank functions find them."""
    given = [os.environ.get(name) for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK")]
    if None not in given:
        return dict(zip(("world_size", "rank", "local_rank"), map(int, given)))  # type: ignore[arg-type]
    return {"world_size": get_world_size(), "rank": get_rank(), "local_rank": get_local_rank()}


def verify_wandb() -> bool:
    """ezpz.verify_wandb: whether a wandb run can start: wandb installed, not disabled (``WANDB_DISABLED``,
    ``WANDB_MODE=disabled``), and offline or with an API key (``WANDB_API_KEY``, wandb's login in ~/.netrc)."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        return False
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if os.environ.get("WANDB_DISABLED") or mode == "disabled":
        return False
    if mode in ("offline", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return "api.wandb.ai" in (Path.home() / ".netrc").read_text()
    except OSError:
        return False


def setup_wandb(project_name: str | None = None, entity: str | None = None, config: Mapping | None = None,
                outdir: str | os.PathLike | None = None, project: str | None = None, **init_kwargs: Any) -> Any:
    """ezpz.setup_wandb: a wandb run on rank 0 (None elsewhere; WANDB_MODE=offline works), its config
    ezpz's run metadata (``tstamp``, ``hostname``, ``world_size``, ...) with yours under ``"config"``
    (secrets redacted); a second call gives wandb's current run with that call's values; None, with
    a warning, when wandb cannot start (``verify_wandb``) or ``wandb.init`` fails (training goes on). A
    run that started is returned even when writing its metadata fails (its metrics still go there)."""
    if get_rank() != 0:
        return None
    log = get_logger("ezpz")
    if not verify_wandb():
        log.warning("wandb is not installed, disabled, or has no API key (set WANDB_MODE=offline to log "
                    "locally): continuing without wandb logging")
        return None
    extra = {k: v for k, v in {"entity": entity, "dir": outdir, **init_kwargs}.items() if v is not None}
    try:
        run = _sinks.setup_wandb(project=project or project_name, **extra)
    except Exception as exc:  # noqa: BLE001 - as ezpz: wandb must not stop training
        log.warning("wandb could not start (%s: %s): continuing without wandb logging", type(exc).__name__, exc)
        return None
    if run is None:
        return None
    try:
        now = datetime.datetime.now()
        run.config.update({**_run_metadata(now), "config": _sinks.redact(dict(config or {}))},
                          allow_val_change=True)
    except Exception as exc:  # noqa: BLE001 - the run is live: metrics still reach it
        log.warning("wandb run %s started, but its metadata could not be written (%s: %s): keeping the run",
                    getattr(run, "name", "?"), type(exc).__name__, exc)
    return run


def _run_metadata(now: datetime.datetime) -> dict[str, Any]:
    import torch

    topo = env_topology()
    return {"hostname": get_hostname(), "pytorch_backend": get_backend(), "torch_version": torch.__version__,
            "world_size": topo.world_size, "machine": get_machine(), "working_directory": os.getcwd(),
            "year": now.year, "month": now.month, "day": now.day, "tstamp": now.isoformat(),
            "scheduler": scheduler_name(), "num_nodes": topo.num_nodes, "ranks_per_node": topo.local_world_size,
            "device_type": _device_type(), "python_version": platform.python_version()}


def _accelerators_per_node() -> int:
    kind = _device_type()
    if kind in ("cuda", "xpu"):
        import torch

        return getattr(torch, kind).device_count()
    return 0


def scheduler_name() -> str:
    """ezpz's name of the scheduler: ``"PBS"``, ``"SLURM"``, ``"LOCAL"`` (``"UNKNOWN"`` when it cannot be told)."""
    try:
        return detect_scheduler().scheduler.upper()
    except ConfigError:  # a summary never fails a script
        return "UNKNOWN"
