"""A stage's future: rank 0's return value, or one StageError that says which
stage, which rank on which node, what exit code, and the tail of its stderr."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ..common.blocks import CONTINUE_EXIT
from ..common.metadata import redact_text
from ..common.outcome import Cause, failure_message, read_outcome
from ..errors import StageError

_TAIL_LINES = 25


class StageFuture(Future):
    """A stage's result, or a StageError; ``outputs`` are its DataFutures.

    ``result_file``: where rank 0's return value lands (None: the app's own
    result is the stage's, as for remote stages)."""

    def __init__(self, stage: str, app_future: Any, stderr: Path | None, result_file: Path | None) -> None:
        super().__init__()
        self.stage = stage
        self.app_future = app_future
        self.outputs = app_future.outputs
        self._stderr, self._result_file = stderr, result_file
        app_future.add_done_callback(self._finish)

    @property
    def from_cache(self) -> bool:
        # Parsl's AppFuture exposes its task's record (public attribute, private schema):
        # "from_memo" is how the DFK marks a memoization hit
        return bool(self.app_future.task_record.get("from_memo"))

    def _finish(self, fut: Any) -> None:
        exc = fut.exception()
        if exc is not None:
            self.set_exception(exc if isinstance(exc, StageError) else stage_error(self.stage, exc, self._stderr))
            return
        if self._result_file is None:  # a remote stage: its summary, or the error it returned
            if (failed := failure_message(fut.result())) is not None:
                self.set_exception(StageError(failed))
            else:
                self.set_result(fut.result())
            return
        try:
            import dill

            with open(self._result_file, "rb") as f:
                self.set_result(dill.load(f))
        except FileNotFoundError:
            self.set_result(None)  # a script stage returns nothing
        except Exception as err:  # noqa: BLE001 - any unreadable result is the stage's failure
            self.set_exception(StageError(f"stage {self.stage!r} finished but its result "
                                          f"{self._result_file} cannot be read: {err}"))


def stderr_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def stage_error(stage: str, exc: BaseException, stderr: Path | None) -> StageError:
    """One error that says which stage, which rank, what exit code, and shows stderr's tail."""
    from parsl.app.errors import BashExitFailure, MissingOutputs
    from parsl.dataflow.errors import DependencyError

    if isinstance(exc, DependencyError):
        return StageError(f"stage {stage!r} did not run: a stage it depends on failed ({exc})")
    if isinstance(exc, MissingOutputs):
        missing = ", ".join(str(getattr(f, "filepath", f)) for f in exc.outputs)
        where = stderr.parent if stderr else "its directory"
        return StageError(f"stage {stage!r} finished but did not write its output(s) {missing}: its ranks run "
                          f"in {where}, where a relative name lands (what they print is in stdout.txt and "
                          f"stderr.txt there)")
    tail = redact_text(stderr_tail(stderr)) if stderr else ""
    outcome = read_outcome(stderr.parent) if stderr else None  # the supervisor's record of the launch
    if isinstance(exc, BashExitFailure) and exc.exitcode == CONTINUE_EXIT:
        head = (f"stage {stage!r} stopped for its block's end (exit code {CONTINUE_EXIT}, its checkpoint saved) "
                f"but nothing submitted it again: inside pt.workflow without a parsl.load of your own, it "
                f"continues in the next block")
    elif isinstance(exc, BashExitFailure):
        # the supervisor's record names the cause (a lost node, not the ranks elsewhere it took down)
        what = outcome.summary if outcome is not None and outcome.cause is not Cause.OK else "a rank failed"
        head = f"stage {stage!r} failed: {what} (exit code {exc.exitcode})"
    else:
        head = f"stage {stage!r} failed: {type(exc).__name__}: {exc}"
    return StageError(f"{head}\n--- last lines of {stderr} ---\n{tail}" if tail else head)
