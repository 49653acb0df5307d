"""How a workflow stops early: SIGTERM (``kill``, a batch system's end) raises ``Terminated`` in its main
thread as Ctrl-C raises KeyboardInterrupt, so that it stops what it started and its status says how it ended."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class Terminated(SystemExit):
    """SIGTERM reached the workflow (``kill``, a batch system's end): it stops as for Ctrl-C, says so in
    its status, and exits 143 as the signal's default would."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


@contextlib.contextmanager
def terminate_cleanly() -> Iterator[None]:
    """While the workflow runs, SIGTERM raises ``Terminated`` in the main thread (a workflow run from
    another thread keeps the process's own handling)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(_signum: int, _frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def how_it_ended(exc: BaseException) -> str | None:
    """What status says of a workflow stopped by a signal (None: the script raised, its error says it)."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (SIGINT)"
    if isinstance(exc, Terminated):
        return "terminated (SIGTERM)"
    return None
