"""ezpz's names and signatures on parsl-torch: ``import parsl_torch.compat.ezpz as ezpz``.

Covers what ezpz's quickstart and ``examples/minimal.py`` call (set-up, ranks,
device, wrapping, logging, timing, History, wandb), with ezpz's (v0.26.1)
behaviour and defaults, and its submodules as import paths
(``parsl_torch.compat.ezpz.history``, ``.log``, ``.utils``, ``.tracker``,
``.distributed``, ``.dist``, ``.configs``, ``.lazy``, ``.__about__``). ``alias()`` registers them under ezpz's own names,
so a script's ``from ezpz.history import History`` runs unchanged. What is not
covered raises a ConfigError that says so; the README lists both.
"""

from __future__ import annotations

import sys

from ...errors import ConfigError
from . import __about__, configs, dist, distributed, history, lazy, log, tracker, utils
from .__about__ import __version__
from .distributed import *  # noqa: F403 (its __all__: set-up, ranks, device, wrapping, wandb)
from .history import History
from .log import get_logger
from .tracker import setup_tracker
from .utils import get_memory_metrics, get_timestamp

__all__ = ["History", "__about__", "__version__", "alias", "barrier", "cleanup", "configs", "dist", "distributed",
           "get_dist_info", "get_hostname",
           "get_local_rank", "get_logger", "get_machine", "get_memory_metrics", "get_node_index", "get_num_nodes",
           "get_rank", "get_timestamp", "get_torch_backend", "get_torch_device", "get_torch_device_type",
           "get_world_size", "history", "lazy", "log", "query_environment", "seed_everything", "setup_torch", "setup_tracker", "setup_wandb",
           "synchronize", "timeitlogit", "tracker", "utils", "verify_wandb", "wrap_model", "wrap_model_for_ddp"]

#: ezpz's module names this package answers for
SUBMODULES = ("__about__", "configs", "dist", "distributed", "history", "lazy", "log", "tracker", "utils")


def alias() -> None:
    """Make ``import ezpz`` and ``from ezpz.<submodule> import ...`` give this package (call it before the
    script's ezpz imports). Refused when the real ezpz is already imported: two would be mixed."""
    this = sys.modules[__name__]
    present = sys.modules.get("ezpz")
    if present is not None and present is not this:
        raise ConfigError("parsl_torch.compat.ezpz.alias(): the real ezpz is already imported; call alias() "
                          "before any `import ezpz`, or import parsl_torch.compat.ezpz as ezpz instead")
    sys.modules["ezpz"] = this
    for name in SUBMODULES:
        sys.modules[f"ezpz.{name}"] = getattr(this, name)
