"""How many accelerators this machine lets its processes see, without importing torch (the
workflow and ``parsl-torch launch`` decide ranks per node before any rank starts).

A visibility variable that is set decides (``CUDA_VISIBLE_DEVICES``, ``ROCR_VISIBLE_DEVICES``,
``HIP_VISIBLE_DEVICES``, ``ZE_AFFINITY_MASK``: its entries); else the devices the drivers made:
NVIDIA's ``/dev/nvidia<N>``, and AMD's GPU nodes of the kernel's KFD topology. An Intel GPU shows
as a render node that an integrated laptop GPU has too: it is counted only through
``ZE_AFFINITY_MASK``, or a site's machine record (Aurora's 12 tiles).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from ..core.claim import VISIBILITY

_NVIDIA = re.compile(r"nvidia\d+")


def visible_accelerators(env: Mapping[str, str] | None = None, dev: str = "/dev",
                         kfd: str = "/sys/class/kfd/kfd/topology/nodes") -> int:
    """The accelerators this process sees (0: none)."""
    return len(visible_ids(env, dev, kfd)[0])


def visible_ids(env: Mapping[str, str] | None = None, dev: str = "/dev",
                kfd: str = "/sys/class/kfd/kfd/topology/nodes") -> tuple[tuple[str, ...], str]:
    """The ids of the accelerators this process sees (in the numbering of the variable that narrows
    them), and that variable."""
    env = os.environ if env is None else env
    for name in VISIBILITY:
        value = env.get(name)
        if value is not None:
            ids = (v.strip() for v in value.split(","))
            return tuple(v for v in ids if v and v not in ("-1", "NoDevFiles")), name
    try:
        nvidia = sum(1 for entry in os.listdir(dev) if _NVIDIA.fullmatch(entry))
    except OSError:
        nvidia = 0
    if nvidia:
        return tuple(map(str, range(nvidia))), "CUDA_VISIBLE_DEVICES"
    return tuple(map(str, range(_amd_gpus(Path(kfd))))), "ROCR_VISIBLE_DEVICES"


def _amd_gpus(nodes: Path) -> int:
    """KFD's topology nodes with a GPU id (CPU nodes have 0)."""
    count = 0
    for node in nodes.glob("*/gpu_id") if nodes.is_dir() else ():
        try:
            count += node.read_text().strip() not in ("", "0")
        except OSError:
            continue
    return count
