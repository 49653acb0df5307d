"""Rank-aware logging: rank 0 speaks, the others stay quiet unless asked.

Nothing is configured at import. ``get_logger`` attaches one stream handler
to the logger it returns (once, however often it is called) and stops
propagation so records are not printed twice by a root handler.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, overload

from ..common import settings
from .ranks import get_rank

F = TypeVar("F", bound=Callable[..., Any])

_FORMAT = "[%(asctime)s][%(levelname)s][rank %(rank)s][%(name)s] %(message)s"


class _RankFilter(logging.Filter):
    """Tags records with the rank; drops them on other ranks if rank_zero_only."""

    def __init__(self, rank_zero_only: bool) -> None:
        super().__init__()
        self.rank_zero_only = rank_zero_only

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = get_rank()
        return record.rank == 0 or not self.rank_zero_only


@contextlib.contextmanager
def lines_to(stream: Any) -> Iterator[None]:
    """Send the log lines of every ``get_logger`` logger to ``stream`` (an object with ``write``) for
    the block: a live display prints them above itself, without replacing ``sys.stderr`` for the
    whole process."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)]
    handlers = [h for lg in loggers for h in lg.handlers if isinstance(h, _StderrHandler)]
    for handler in handlers:
        handler.diverted = stream
    try:
        yield
    finally:
        for handler in handlers:
            handler.diverted = None


class _StderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is when a record is emitted, not as it was when the
    logger was made (notebooks, progress bars and test captures replace it), or to where
    ``lines_to`` sends it."""

    diverted: Any = None

    @property
    def stream(self) -> Any:  # type: ignore[override]
        return self.diverted or sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def get_logger(name: str = "parsl_torch", level: str | int | None = None,
               rank_zero_only: bool = True) -> logging.Logger:
    """A logger that prints on rank 0 only (all ranks with ``rank_zero_only=False``).

    Level: ``level``, else ``PARSL_TORCH_LOG_LEVEL``, else INFO.
    """
    logger = logging.getLogger(name)
    level = level or settings.LOG_LEVEL.get()
    logger.setLevel(level.upper() if isinstance(level, str) else level)
    handler = next((h for h in logger.handlers if getattr(h, "_parsl_torch", False)), None)
    if handler is None:
        handler = _StderrHandler()
        handler._parsl_torch = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        logger.addHandler(handler)
        logger.propagate = False
    handler.filters = [_RankFilter(rank_zero_only)]
    return logger


@functools.lru_cache(maxsize=1)
def _timing_logger() -> logging.Logger:
    # created on first timed call, not when a function is decorated
    return get_logger("parsl_torch.timeit", rank_zero_only=False)


@overload
def timeitlogit(func: F) -> F: ...
@overload
def timeitlogit(func: None = None, *, rank: int | None = 0) -> Callable[[F], F]: ...


def timeitlogit(func: F | None = None, *, rank: int | None = 0):
    """Decorator that logs how long each call took, on ``rank`` (None: every rank).

    Use bare (``@timeitlogit``) or with arguments (``@timeitlogit(rank=None)``).
    """

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                if rank is None or get_rank() == rank:
                    dt = time.perf_counter() - t0
                    _timing_logger().info("%s took %.4f s", f.__qualname__, dt)

        return wrapper  # type: ignore[return-value]

    return decorate(func) if func is not None else decorate


def said_once_when_unwritable(handler: logging.FileHandler, logger: logging.Logger) -> None:
    """A log file that cannot be written (its file system full) is said once, on ``logger``, instead of
    Python's traceback for every record (thousands on a full disk, burying the error that matters)."""
    said = []

    def handle_error(record: logging.LogRecord) -> None:
        if not said:
            said.append(True)
            logger.warning("cannot write the log %s (%s): its records are dropped", handler.baseFilename,
                           sys.exc_info()[1])

    handler.handleError = handle_error  # type: ignore[method-assign]
