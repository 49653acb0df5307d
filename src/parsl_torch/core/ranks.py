"""Who this rank is, cheaply, before and after ``setup_torch``.

The process group's answer once there is one, the launcher's environment
before. Never imports torch: ``process_group()`` only looks at
``torch.distributed`` if something else already imported it, so logging and
history code can ask on every record without paying for torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .topology import env_topology


@dataclass
class RankState:
    """What this process keeps between calls of parsl-torch's free functions
    (``setup_torch``, ``should_checkpoint``, ``breakpoint``, ``cleanup``): the one
    place with process-wide state in the package (a layout test holds it)."""

    #: called before the process group is destroyed (``should_checkpoint``'s reduction in flight)
    before_cleanup: list[Callable[[], None]] = field(default_factory=list)
    #: breakpoints passed so far (the ranks' keys in the store agree on it)
    breakpoints: int = 0
    #: the exit handover is registered with atexit (once per process)
    exit_handover: bool = False
    #: ``core.deadline``'s agreement that the block is ending, made at its first use
    deadline: Any = None


_STATE = RankState()


def rank_state() -> RankState:
    """This process's ``RankState``."""
    return _STATE


def process_group() -> Any:
    """``torch.distributed`` when a process group is up, else None (never imports torch)."""
    mod = sys.modules.get("torch.distributed")
    return mod if mod is not None and mod.is_available() and mod.is_initialized() else None


def get_rank() -> int:
    """This process's global rank (0 without a launcher)."""
    d = process_group()
    return d.get_rank() if d else env_topology().rank


def get_world_size() -> int:
    """How many ranks the job has (1 without a launcher)."""
    d = process_group()
    return d.get_world_size() if d else env_topology().world_size


def get_local_rank() -> int:
    """This rank's index among the ranks on its node."""
    return env_topology().local_rank
