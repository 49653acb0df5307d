"""Who this rank is, cheaply, before and after ``setup_torch``.

The process group's answer once there is one, the launcher's environment
before. Never imports torch: ``process_group()`` only looks at
``torch.distributed`` if something else already imported it, so logging and
history code can ask on every record without paying for torch.
"""

from __future__ import annotations

import sys
from typing import Any

from .topology import env_topology


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
