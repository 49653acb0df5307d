"""Memoization that never returns a stale result.

A stage call's memo key is its identity (``identity``'s components: code, the
user modules it reaches, options, arguments, the content of every file it is
told about), computed here when the call is ready to run, after the futures
it waits on have resolved, instead of Parsl's ``make_hash`` (which pickles
functions by name). ``StageMemoizer`` adds the rule Parsl cannot know: a hit
stands only if the stage directory still holds that call's files
(``.call.json``, written when the call succeeds, removed when any run of the
stage starts), and it logs why a stage runs again. Other apps in the same
workflow keep Parsl's own rules (a File by its content).
"""

from __future__ import annotations

import contextvars
import functools
import pickle
import threading
from concurrent.futures import Future
from typing import Any

from ...common.stagedir import PREVIOUS
from ...core.log import get_logger
from ...errors import StageError
from .. import identity
from ..call import StageCall
from ..freshdir import is_new_call

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


def stage_memoizer(checkpoint_files: list[str], cache: identity.DigestCache, stopping: threading.Event) -> Any:
    """A Parsl memoizer for stages (Parsl's BasicMemoizer with the rules above), digests in the run's
    ``cache``. Once ``stopping`` is set (the workflow script raised), a stage about to start fails instead."""
    from parsl.dataflow.memoization import BasicMemoizer

    checked: dict[int, dict[str, str]] = {}  # task id -> its identity when it was launched

    class StageMemoizer(BasicMemoizer):
        def check_memo(self, task):
            call = StageCall.of_task(task)
            if call is None or not self.memoize or not task["memoize"]:
                token = _file_digests.set(cache)  # Files in the user's own apps, through the run's cache
                try:
                    return super().check_memo(task)
                finally:
                    _file_digests.reset(token)
            if stopping.is_set():
                refused: Future = Future()
                refused.set_exception(StageError(f"stage {call.stage!r} did not start: the workflow script "
                                                 f"raised an error before it could"))
                return refused
            args, kwargs = task["args"][1:], task["kwargs"]
            checked[task["id"]] = now = identity.stage_components(call, args, kwargs, cache)
            task["hashsum"] = key = identity.call_id(now)
            modules = tuple(k[len("module "):] for k in now if k.startswith("module "))
            task["args"][0] = call.identified(key, modules)  # (the list Parsl submits: the ranks' checkpoints are this call's)
            result = self.memo_lookup_table.get(key)
            before = identity.read_call(call.opts.stage_dir)
            hit = result is not None and before is not None and before.memo_key == key
            gone, changed = identity.spoiled_files(call.opts.stage_dir, call.returns, kwargs.get("outputs", ()),
                                                   before, cache) if hit else ([], [])
            read = identity.stale_reads(before, call.opts.stage_dir, call.opts.environment, cache) \
                if hit and not gone and not changed else []
            if hit and not gone and not changed and not read:
                return result
            if not task.get("try_id"):  # a retry or continuation: why it runs was said at its first try
                _say_why(call, key, before, now, result is not None, gone, changed, read)
            if changed:
                _set_aside(call, kwargs.get("outputs", ()), before, cache)
            return None

        def update_memo_result(self, task, r):
            super().update_memo_result(task, r)
            call, parts = StageCall.of_task(task), checked.pop(task["id"], None)
            if call is not None and parts is not None and task.get("hashsum"):
                identity.write_call(call.opts.stage_dir, task["hashsum"], parts, task["kwargs"].get("outputs", ()),
                                    cache, call.opts.environment)

        def update_memo_exception(self, task, e):
            checked.pop(task["id"], None)
            super().update_memo_exception(task, e)

    return StageMemoizer(checkpoint_files=checkpoint_files, checkpoint_mode="task_exit")


def _say_why(call: StageCall, key: str, before: Any, now: dict[str, str], memo_hit: bool, gone: list[str],
             changed: list[str], read: list[str]) -> None:
    why = identity.spoiled_said(gone, changed) if gone or changed else ", ".join(read) if read else \
        identity.why_rerun(call.stage, call.name, before, now, memo_hit)
    log = get_logger("parsl_torch.workflow")
    log.info("[%s] runs%s: %s", call.stage, " again" if before or memo_hit else "", why)
    if is_new_call(call.opts.stage_dir, key):
        log.info("[%s] a new call: the previous call's files go to %s/%s/", call.stage, call.stage, PREVIOUS)


def _set_aside(call: StageCall, outputs: Any, before: Any, cache: Any) -> None:
    """A rerun's outputs that were changed since its call wrote them go aside, said in the log: read as
    they are, a damaged one could fail the rerun, and every rerun after it."""
    moved = identity.set_aside(call.opts.stage_dir, outputs, before, cache)
    get_logger("parsl_torch.workflow").info("[%s] set aside, so that the rerun starts without them: %s",
                                            call.stage, ", ".join(moved))
