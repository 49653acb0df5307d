"""A stage's future: rank 0's return value, or one StageError that says which
stage, which rank on which node, what exit code, and the tail of its stderr."""

from __future__ import annotations

from collections.abc import Callable, Collection
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ...errors import StageError
from .failures import stage_error


class StageFuture(Future):
    """A stage's result, or a StageError; ``outputs`` are its DataFutures (done when it is, or
    raising its StageError).

    ``result_file``: where rank 0's return value lands (None: the app's own
    result is the stage's: a script's exit code); ``answer``: a route whose app returns an answer (a
    remote stage's) says with it what the value is and whether the stage was skipped, or raises the
    stage's error; ``secrets``: its workflow's (``Workflow.secrets``), kept out of its error."""

    def __init__(self, stage: str, app_future: Any, stderr: Path | None, result_file: Path | None,
                 answer: Callable[[Any], tuple[Any, bool]] | None = None, secrets: Collection[str] = ()) -> None:
        from parsl.app.futures import DataFuture

        super().__init__()
        self.stage = stage
        self.app_future = app_future
        # (this future's own, not the app's: a failed stage's file raises the same StageError as its result)
        self.outputs = [DataFuture(self, out.file_obj, tid=out.tid) for out in app_future.outputs]
        self._stderr, self._result_file, self._answer, self._secrets = stderr, result_file, answer, secrets
        self._skipped = False  # the answer said so (where it runs, Parsl's record says it: ``from_cache``)
        app_future.add_done_callback(self._finish)

    @property
    def from_cache(self) -> bool:
        # Parsl's AppFuture exposes its task's record (public attribute, private schema):
        # "from_memo" is how the DFK marks a memoization hit
        return self._skipped or bool(self.app_future.task_record.get("from_memo"))

    def _finish(self, fut: Any) -> None:
        """This future settled from the app's; whatever goes wrong doing that fails it, naming the stage: a
        future left unresolved would hold the workflow waiting on it for ever (raised in a done callback,
        an error is only logged)."""
        try:
            self._settle(fut)
        except Exception as err:  # noqa: BLE001 - any: never a hang
            if not self.done():
                self.set_exception(StageError(f"stage {self.stage!r} ended, but its outcome could not be read: "
                                              f"{type(err).__name__}: {err}"))

    def _settle(self, fut: Any) -> None:
        exc = fut.exception()
        if exc is not None:
            self.set_exception(exc if isinstance(exc, StageError) else stage_error(self.stage, exc, self._stderr, self._secrets))
            return
        if self._answer is not None:
            try:
                value, self._skipped = self._answer(fut.result())
            except StageError as err:
                self.set_exception(err)
                return
            self.set_result(value)
            return
        if self._result_file is None:
            self.set_result(fut.result())  # a script stage: its exit code
            return
        try:
            import dill

            with open(self._result_file, "rb") as f:
                self.set_result(dill.load(f))
        except FileNotFoundError:  # (its supervisor fails a run without it: this one was deleted meanwhile)
            self.set_exception(StageError(f"stage {self.stage!r} finished but its return value "
                                          f"{self._result_file} is gone: run the workflow again to run it again"))
        except Exception as err:  # noqa: BLE001 - any unreadable result is the stage's failure
            self.set_exception(StageError(f"stage {self.stage!r} finished but its result "
                                          f"{self._result_file} cannot be read: {err}"))
