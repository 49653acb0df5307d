"""parsl-torch: distributed PyTorch training and evaluation as Parsl workflows.

Importing the package is cheap: names are loaded on first use, so
``import parsl_torch`` pulls in no torch, parsl, h5py or wandb.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it (the layers: docs/architecture.md)
_LAZY = {
    "Topology": "core.topology",
    "get_topology": "core.topology",
    "setup_torch": "core.dist",
    "cleanup": "core.dist",
    "barrier": "core.dist",
    "breakpoint": "core.dist",
    "exit_process": "core.dist",
    "should_checkpoint": "core.deadline",
    "to_be_continued": "core.deadline",
    "stop_requested": "core.deadline",
    "Snapshots": "core.snapshot",
    "get_rank": "core.ranks",
    "get_world_size": "core.ranks",
    "get_local_rank": "core.ranks",
    "get_torch_device_type": "core.device",
    "get_torch_device": "core.device",
    "get_backend": "core.device",
    "wrap_model": "core.wrap",
    "Layout": "core.layout",
    "data_parallel_coords": "core.wrap",
    "settle_buckets": "core.wrap",
    "Throughput": "core.flops",
    "get_logger": "core.log",
    "timeitlogit": "core.log",
    "History": "history.recorder",
    "load_history": "history.h5file",
    "read_history": "history.h5file",
    "plot_history": "history.plots",
    "setup_wandb": "history.sinks",
    "CSVSink": "history.sinks",
    "WandbSink": "history.sinks",
    "distributed_app": "apps.stage.app",
    "script_app": "apps.stage.app",
    "StageFuture": "apps.stage.futures",
    "workflow": "apps.session.workflow",
    "sweep": "stages.sweep",
    "Trial": "stages.sweep",
    "Sampled": "apps.sweeps.sample",
    "ParslTorchError": "errors",
    "ConfigError": "errors",
    "TopologyError": "errors",
    "SiteError": "errors",
    "StageError": "errors",
}
# public submodule name -> where it lives
_SUBMODULES = {"models": "core.models", "sites": "sites", "stages": "stages", "remote": "apps.remote.client",
               "report": "apps.session.report"}

__all__ = sorted([*_LAZY, *_SUBMODULES, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{_SUBMODULES[name]}", __name__)
    else:
        raise AttributeError(f"module 'parsl_torch' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
