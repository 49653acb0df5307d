"""``ezpz.dist``: ezpz's older name for ``ezpz.distributed`` (the same functions)."""

from __future__ import annotations

from .distributed import *  # noqa: F403
from .distributed import __all__  # noqa: F401
