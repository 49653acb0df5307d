"""``ezpz.configs``: the logging configuration and the scheduler's name, as ezpz's module gives them.

``get_logging_config`` returns a ``logging.config.dictConfig`` dict in ezpz's shape (``handlers``,
``root``, ``loggers``), for a terminal only: unlike ezpz it writes no ``logs/`` folder and no JSON
log file (a stage's output is in its directory already; the README lists this)."""

from __future__ import annotations

from typing import Any

from ...core.ranks import get_rank
from .distributed import scheduler_name

__all__ = ["get_logging_config", "get_scheduler"]


def get_logging_config(rank: int | None = None) -> dict[str, Any]:
    """A dictConfig for ``rank`` (default this process's): INFO on rank 0, CRITICAL on the others."""
    rank = get_rank() if rank is None else int(rank)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"simple": {"format": "[%(asctime)s][%(levelname)s][%(name)s] %(message)s"}},
        "handlers": {"term": {"class": "logging.StreamHandler", "formatter": "simple", "level": "INFO",
                              "stream": "ext://sys.stderr"}},
        "root": {"handlers": ["term"], "level": "INFO" if rank == 0 else "CRITICAL"},
        "loggers": {},
    }


def get_scheduler() -> str:
    """``"PBS"``, ``"SLURM"`` or ``"LOCAL"`` (``"UNKNOWN"`` when the job's variables do not say)."""
    return scheduler_name()
