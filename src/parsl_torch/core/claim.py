"""One rank per accelerator under nccl and xccl.

NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected"), and only
when the communicator is first used, seconds after the start, in a traceback that names
neither the ranks nor the fix. So before the process group starts, each rank claims its
device in the rendezvous store (by the device's UUID: a launcher that gives each rank its
own GPU renumbers them all from 0); once every rank has claimed one, every rank fails at
once if any two of one node claimed the same, with the counts and the fixes. gloo and mpi
can share a device (they stage tensors through the host): they claim nothing.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

from ..errors import ConfigError

#: backends that can run two ranks on one device
SHARING_BACKENDS = ("gloo", "mpi")
#: the variables that narrow which accelerators a process sees
VISIBILITY = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")
_PREFIX = "parsl_torch/claims"


def device_key(device: Any) -> str:
    """The physical device behind ``device`` (a torch.device of cuda or xpu): its UUID where torch
    gives one, else its index in the node's own numbering (through a visibility variable)."""
    import torch

    backend = getattr(torch, device.type)
    index = device.index if device.index is not None else backend.current_device()
    uuid = str(getattr(backend.get_device_properties(index), "uuid", None) or "")
    if uuid and " at 0x" not in uuid:  # (a repr naming a Python object differs in every process: not an id)
        return f"{device.type}:{uuid}"
    visible = next((os.environ[v].split(",") for v in VISIBILITY if os.environ.get(v)), None)
    return f"{device.type}:{visible[index].strip() if visible and index < len(visible) else index}"


def claim_device(store: Any, host: str, key: str, world_size: int, timeout_s: float, *, ranks_on_node: int,
                 visible: int, backend: str) -> None:
    """Claim ``key`` on ``host`` for this rank; after every rank has, raise on every rank if two of one
    node claimed one device (``ranks_on_node`` and ``visible``: this node's counts, for the message)."""
    claims = store.add(f"{_PREFIX}/{host}/{key}", 1)
    if claims > 1:
        store.set(f"{_PREFIX}/shared", f"{host}\n{key}")
    if store.add(f"{_PREFIX}/claimed", 1) == world_size:
        store.set(f"{_PREFIX}/all", "1")
    store.wait([f"{_PREFIX}/all"], datetime.timedelta(seconds=timeout_s))
    if not store.check([f"{_PREFIX}/shared"]):
        return
    where, shared = store.get(f"{_PREFIX}/shared").decode().split("\n", 1)
    count = store.add(f"{_PREFIX}/{where}/{shared}", 0)
    kind = key.split(":", 1)[0]
    fits = max(visible, 1)
    raise ConfigError(
        f"{count} ranks of node {where} would share one {kind} device ({shared}), and {backend} refuses two ranks "
        f"on one device: this node ({host}) has {ranks_on_node} rank(s) and {visible} visible {kind} device(s). "
        f"Launch at most {fits} rank(s) per node (a stage's ranks_per_node={fits}, parsl-torch launch -n {fits}), "
        f"make more devices visible ({', '.join(VISIBILITY[:2])}), or let ranks share a device over gloo "
        f"(TORCH_BACKEND=gloo, much slower)")
