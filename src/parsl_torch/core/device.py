"""Which device this rank computes on and which collective backend fits it.

Order: ``TORCH_DEVICE`` (cuda, xpu, mps, cpu), else the first of xpu, cuda,
mps that is available, else cpu (ezpz's order). Backend: ``TORCH_BACKEND``, else
nccl for cuda, xccl for xpu (ccl where this torch has no xccl), gloo otherwise.
"""

from __future__ import annotations

import os

from ..common import settings
from ..errors import ConfigError
from .topology import env_topology

DEVICE_TYPES = ("cuda", "xpu", "mps", "cpu")
BACKENDS = ("nccl", "xccl", "gloo", "mpi", "ccl")
_DEFAULT_BACKEND = {"cuda": "nccl", "xpu": "xccl"}
# a backend that cannot drive a device's tensors, with the fix to suggest
_BACKEND_NEEDS = {"nccl": "cuda", "xccl": "xpu"}


def get_torch_device_type() -> str:
    """``"cuda"``, ``"xpu"``, ``"mps"`` or ``"cpu"``."""
    forced = (settings.DEVICE.get() or "").lower()
    if forced:
        kind = forced.split(":")[0]
        if kind not in DEVICE_TYPES:
            raise ConfigError(
                f"TORCH_DEVICE={forced!r} is not a device type: use one of {', '.join(DEVICE_TYPES)}"
            )
        return kind
    import torch

    _fix_rocm_visibility(torch)
    if hasattr(torch, "xpu") and torch.xpu.is_available():  # first, as ezpz: a torch that has both
        return "xpu"
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def _fix_rocm_visibility(torch) -> None:
    """Parsl pins a worker to a GPU by setting ROCR_VISIBLE_DEVICES and
    CUDA_VISIBLE_DEVICES to the same id. Under ROCm the second indexes the list
    the first already narrowed, so torch sees no GPU (Frontier): drop it."""
    rocr, cuda = os.environ.get("ROCR_VISIBLE_DEVICES"), os.environ.get("CUDA_VISIBLE_DEVICES")
    if getattr(torch.version, "hip", None) and rocr and rocr == cuda:
        del os.environ["CUDA_VISIBLE_DEVICES"]


def device_index(local_rank: int, count: int, order: str | None = None) -> int:
    """Accelerator of ``local_rank``: ``local_rank % count``, or the machine's order
    (PARSL_TORCH_GPU_ORDER, e.g. Polaris "3,2,1,0": its NUMA layout) when it covers ``count``."""
    index = local_rank % count
    if order:
        gpus = list(settings.GPU_ORDER.get({settings.GPU_ORDER.name: order}))
        if sorted(gpus) == list(range(count)):  # a narrowed CUDA_VISIBLE_DEVICES: the plain order
            index = gpus[index]
    return index


def get_torch_device(local_rank: int | None = None):
    """This rank's ``torch.device``: accelerator ``local_rank % count`` (in the machine's
    order, see ``device_index``), or cpu/mps."""
    import torch

    kind = get_torch_device_type()
    if kind in ("cuda", "xpu"):
        if local_rank is None:
            local_rank = env_topology().local_rank
        count = getattr(torch, kind).device_count()
        if count == 0:
            raise ConfigError(
                f"device type {kind!r} was chosen but no {kind} device is visible "
                f"(check CUDA_VISIBLE_DEVICES / ZE_AFFINITY_MASK, or set TORCH_DEVICE=cpu)"
            )
        return torch.device(kind, device_index(local_rank, count, settings.GPU_ORDER.raw()))
    return torch.device(kind)


def get_backend(device_type: str | None = None) -> str:
    """The collective backend for ``device_type`` (default: this rank's)."""
    device_type = device_type or get_torch_device_type()
    forced = (settings.BACKEND.get() or "").lower()
    backend = forced or (_xpu_backend() if device_type == "xpu" else _DEFAULT_BACKEND.get(device_type, "gloo"))
    return check_backend(backend, device_type, source=settings.BACKEND.name if forced else "backend")


def _xpu_backend() -> str:
    """xccl where this torch has it (2.8 and later), else oneCCL's ccl (older torch with
    oneccl_bindings_for_pytorch, as on Aurora's earlier frameworks): ezpz's rule."""
    import torch.distributed as dist

    return "xccl" if dist.is_available() and dist.is_backend_available("xccl") else "ccl"


def check_backend(backend: str, device_type: str, source: str = "backend") -> str:
    """``backend`` if it can run collectives on ``device_type``, else a ConfigError."""
    if backend not in BACKENDS:
        raise ConfigError(
            f"{source}={backend!r} is not a known backend: use one of {', '.join(BACKENDS)}"
        )
    needs = _BACKEND_NEEDS.get(backend)
    if needs and needs != device_type:
        raise ConfigError(
            f"{source}={backend!r} needs {needs} devices but this rank uses {device_type!r}: "
            f"use {_DEFAULT_BACKEND.get(device_type, 'gloo')!r} or set TORCH_DEVICE={needs}"
        )
    return backend
