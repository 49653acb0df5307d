"""Parsl's memoizer for a workflow's stages (``StageMemoizer``): a stage call's key is its identity
(``identity``), computed when it is ready to run, instead of Parsl's ``make_hash`` (which pickles functions
by name), and its hit is the verdict's (``verdict``). Other apps keep Parsl's rules (a File by its content).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import pickle
import threading
from concurrent.futures import Future
from typing import Any, Iterator

from parsl.dataflow.memoization import BasicMemoizer

from ...core.log import get_logger
from ...errors import StageError
from .. import identity
from ..stage.call import StageCall
from .reads import recorded as recorded_reads
from .verdict import Verdict, gate, read_paths

#: the digest cache of the run whose memoizer is deciding a call of the user's own apps: Parsl's
#: ``id_for_memo`` is one process-wide function that cannot be handed it (set only around that call)
_file_digests: contextvars.ContextVar[identity.DigestCache | None] = contextvars.ContextVar(
    "parsl_torch_file_digests", default=None)


@functools.lru_cache(maxsize=1)
def register_memo_ids() -> None:
    """A File in the user's own apps is identified by its content (Parsl's ``id_for_memo``: once per process)."""
    from parsl.data_provider.files import File
    from parsl.dataflow.memoization import id_for_memo

    @id_for_memo.register(File)
    def _file(obj: File, output_ref: bool = False) -> bytes:
        if output_ref or obj.scheme != "file":
            return pickle.dumps(("File", obj.url))  # an output is named, not read
        cache = _file_digests.get() or identity.DigestCache(None)
        digest = cache.file_digest(obj.filepath)
        cache.save()
        return pickle.dumps(("File", obj.url, digest))


class StageMemoizer(BasicMemoizer):
    """Parsl's ``BasicMemoizer`` with the stages' rules, digests in the run's ``cache``; once ``stopping``
    is set (the workflow script raised), a stage about to start fails instead."""

    def __init__(self, checkpoint_files: list[str], cache: identity.DigestCache, stopping: threading.Event) -> None:
        super().__init__(checkpoint_files=checkpoint_files, checkpoint_mode="task_exit")
        self.cache, self.stopping = cache, stopping
        self._running: dict[int, Verdict] = {}  # task id -> the verdict it runs under
        self._writing: dict[int, tuple[str, set[str]]] = {}  # task id -> its stage, the files its last run wrote
        self._skipped: dict[str, set[str]] = {}  # a stage skipped in this run -> the files it read

    def check_memo(self, task: Any) -> Future | None:
        """Parsl's contract: the future of the task's earlier result when it need not run, else None; either
        way ``task["hashsum"]`` is its key. A stage call's key is its identity and the skip gate decides
        (``verdict.gate``: a call that runs gets what its verdict asks before its attempt), and the log
        says why it runs (at its first try: a retry or continuation runs for the same reason)."""
        call = StageCall.of_task(task)
        if call is None or not self.memoize or not task["memoize"]:
            token = _file_digests.set(self.cache)  # Files in the user's own apps, through the run's cache
            try:
                return super().check_memo(task)
            finally:
                _file_digests.reset(token)
        if self.stopping.is_set():
            refused: Future = Future()
            refused.set_exception(StageError(f"stage {call.stage!r} did not start: the workflow script "
                                             f"raised an error before it could"))
            return refused
        written_now = {path: stage for stage, paths in self._writing.values() for path in paths}
        found = gate(call, task["args"][1:], task["kwargs"], self.cache,
                     lambda key: self.memo_lookup_table.get(key) is not None, written_now)
        task["hashsum"] = found.key
        if found.skips:
            self._skipped[call.stage] = read_paths(found.before)
            return self.memo_lookup_table[found.key]
        self._running[task["id"]] = found
        self._writing[task["id"]] = (call.stage, self._written_by(call))
        log = get_logger("parsl_torch.workflow")
        if not task.get("try_id"):
            why, *more = found.said(call.stage)
            log.info("[%s] runs%s: %s", call.stage, " again" if found.again else "", why)
            for line in more:
                log.info("[%s] %s", call.stage, line)
        if found.moved:
            log.info("[%s] set aside, so that the rerun starts without them: %s", call.stage, ", ".join(found.moved))
        return None

    def _written_by(self, call: StageCall) -> set[str]:
        """The files the stage's last run wrote (as its ranks were seen to: ``w`` lines); a stage skipped
        earlier in this run that read one of them is told in a warning: it came first by chance."""
        record = recorded_reads(call.opts.stage_dir)
        written = {line[2:] for line in (record.reads if record else ()) if line.startswith("w ")}
        for stage, read in self._skipped.items():
            for path in sorted(read & written):
                get_logger("parsl_torch.workflow").warning(
                    "[%s] was skipped before %r ran, which writes %s, which it read: with no dependency between "
                    "them, its result may be of that file before %r rewrites it (pass %r's future to it)",
                    stage, call.stage, path, call.stage, call.stage)
        return written

    def update_memo_result(self, task: Any, r: Future) -> None:
        """Parsl's contract: a finished task's result is kept under its key (and checkpointed). A stage's
        directory also gets its call's record (``.call.json``: its identity, its outputs' digests and what
        it read), which the next verdict compares."""
        call, found = StageCall.of_task(task), self._running.pop(task["id"], None)
        self._writing.pop(task["id"], None)
        with _said_not_raised(task, "finished, but its record"):
            super().update_memo_result(task, r)
            if call is not None and found is not None:
                identity.write_call(call.opts.stage_dir, found.key, found.parts, task["kwargs"].get("outputs", ()),
                                    self.cache, call.opts.environment)

    def update_memo_exception(self, task: Any, e: BaseException) -> None:
        """Parsl's contract: a failed task's result is not kept (nor its verdict)."""
        self._running.pop(task["id"], None)
        self._writing.pop(task["id"], None)
        with _said_not_raised(task, "failed, and Parsl's checkpoint of it"):
            super().update_memo_exception(task, e)


@contextlib.contextmanager
def _said_not_raised(task: Any, what: str) -> Iterator[None]:
    """A record of a task that ended, which could not be written (a full disk), said and not raised: raised in
    Parsl's done callback, it would leave the task's future unresolved, and the workflow waiting on it for
    ever. A stage without its record runs again next time, as it should (a record half made is removed)."""
    try:
        yield
    except Exception as exc:  # (any: a hang is worse than a stage run again)
        call = StageCall.of_task(task)
        get_logger("parsl_torch.workflow").warning(
            "[%s] %s could not be written%s (%s): a rerun runs it again", call.stage if call else f"task {task['id']}",
            what, f" in {call.opts.stage_dir}" if call else "", exc)
        if call is not None:
            with contextlib.suppress(OSError):
                identity.forget_call(call.opts.stage_dir)
