"""A stage's end, as its supervisor recorded it, reaches the stage's future even when Parsl's answer
cannot come.

A scheduler that ends the whole batch job for one lost node (Slurm without ``--no-kill``) ends
Parsl's worker with it, before the worker can send the task's answer: Parsl fails the task only
when the manager's heartbeat runs out (120 s by default), minutes after the supervisor's outcome
(``<stage>/.outcome.json``, ``common.outcome``) was on the shared file system. A thread of the
workflow looks at each running stage's record once a second; an outcome of this try that Parsl has
not answered ``SETTLE_S`` after it was final ends the task with it (the executor's ``settle``): the
same failure, exit code and retry as Parsl's answer would have given."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...common import stagedir
from ...observe.recorder import file_state
from ...common.outcome import Cause, read_outcome

#: seconds a final outcome waits for Parsl's own answer (which comes within a second when the worker lives)
SETTLE_S = 3.0
#: seconds between two looks at the running stages' records
POLL_S = 1.0


@dataclass
class _Watched:
    """One stage's task; ``try_future``: its try that was looked at last, with its record's state then
    (``before``: an earlier try's outcome is not this one's), and the outcome seen since (``seen``, when)."""

    app_future: Any
    stage_dir: Path
    try_future: Any = None
    before: str | None = None
    seen: str | None = None
    seen_at: float = 0.0


class Settler:
    """The workflow's thread that ends a stage's task from its supervisor's outcome (``executors``:
    Parsl's, by label; those without ``settle`` are left to Parsl)."""

    def __init__(self, executors: dict[str, Any], log: Any) -> None:
        self.executors, self.log = executors, log
        self._watched: list[_Watched] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Settler:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def watch(self, app_future: Any, stage_dir: Path) -> None:
        with self._lock:
            self._watched.append(_Watched(app_future, stage_dir))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="parsl-torch-settler", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            with self._lock:
                self._watched = [w for w in self._watched if not w.app_future.done()]
                watched = list(self._watched)
            for w in watched:
                try:
                    self._look(w)
                except Exception as exc:  # noqa: BLE001 - a look that fails leaves the task to Parsl
                    self.log.debug(f"outcomes: {w.stage_dir}: {exc!r}")

    def _look(self, w: _Watched) -> None:
        record = w.app_future.task_record
        try_future = record.get("exec_fu")
        if try_future is None or try_future.done():
            return
        path = w.stage_dir / stagedir.OUTCOME
        state = file_state(str(path))
        if try_future is not w.try_future:  # a new try: a record there now is an earlier try's
            w.try_future, w.before, w.seen = try_future, state, None
            return
        if state is None or state == w.before:
            return
        if state != w.seen:
            w.seen, w.seen_at = state, time.monotonic()
            return
        outcome = read_outcome(w.stage_dir)
        if outcome is None or outcome.cause is Cause.OK:
            return
        waited = time.monotonic() - w.seen_at
        if waited < SETTLE_S + outcome.checking:
            return
        settle = getattr(self.executors.get(record.get("executor")), "settle", None)
        if settle is None:
            return
        from parsl.app.errors import BashExitFailure

        if settle(try_future, BashExitFailure(record.get("func_name", w.stage_dir.name), outcome.exit_code)):
            self.log.warning(f"[{w.stage_dir.name}] its supervisor's outcome ({outcome.summary}) has had no answer "
                             f"from Parsl for {waited:.0f} s (its worker ended with the batch job?): the stage "
                             f"ends with it")
