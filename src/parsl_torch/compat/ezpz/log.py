"""``ezpz.log``: ezpz's ``get_logger`` on parsl-torch's loggers."""

from __future__ import annotations

from typing import Any

from ...core import log as _log
from ...core.ranks import get_rank

__all__ = ["get_logger", "getLogger"]


def get_logger(name: str | None = None, level: str | None = None, rank_zero_only: bool = True,
               rank: int | str | None = None, colored_logs: bool | None = True) -> Any:
    """ezpz.get_logger: with ``rank_zero_only``, a logger at CRITICAL on ranks other than 0 (``rank``,
    else this process's), else at ``level``; asked again for the same name, it takes the new level
    (colours are not made)."""
    logger = _log.get_logger(name or "ezpz.log", level, rank_zero_only=False)
    rank = get_rank() if rank is None else int(rank)
    if rank_zero_only and rank != 0:
        logger.setLevel("CRITICAL")
    return logger


getLogger = get_logger
