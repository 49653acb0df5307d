"""``ezpz.utils``: timestamps, accelerator memory, the debugger; and what the compat package says
when a name is not covered."""

from __future__ import annotations

import datetime
import os
from typing import Any

from ...core.device import get_torch_device_type as _device_type
from ...core.dist import breakpoint
from ...errors import ConfigError

__all__ = ["breakpoint", "get_memory_metrics", "get_timestamp"]


def not_covered(what: str, instead: str) -> ConfigError:
    return ConfigError(f"parsl_torch.compat.ezpz: {what} is not covered; {instead}")


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
