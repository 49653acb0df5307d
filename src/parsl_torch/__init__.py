"""parsl-torch: distributed PyTorch training and evaluation as Parsl workflows.

Importing the package is cheap: names are loaded on first use, so
``import parsl_torch`` pulls in no torch, parsl, h5py or wandb.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "Topology": "topology",
    "get_topology": "topology",
    "setup_torch": "dist",
    "cleanup": "dist",
    "barrier": "dist",
    "breakpoint": "dist",
    "get_rank": "dist",
    "get_world_size": "dist",
    "get_local_rank": "dist",
    "get_torch_device_type": "device",
    "get_torch_device": "device",
    "get_backend": "device",
    "wrap_model": "wrap",
    "data_parallel_coords": "wrap",
    "History": "history",
    "load_history": "history_io",
    "read_history": "history_io",
    "plot_history": "plots",
    "setup_wandb": "tracking",
    "CSVSink": "tracking",
    "WandbSink": "tracking",
    "distributed_app": "apps",
    "script_app": "apps",
    "StageFuture": "apps",
    "workflow": "workflow",
    "get_logger": "log",
    "timeitlogit": "log",
    "ParslTorchError": "errors",
    "ConfigError": "errors",
    "TopologyError": "errors",
    "SiteError": "errors",
    "StageError": "errors",
}
_SUBMODULES = {"models", "sites", "stages", "remote", "report"}

__all__ = sorted([*_LAZY, *_SUBMODULES, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'parsl_torch' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
