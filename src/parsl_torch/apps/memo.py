"""Memoization that never returns a stale result.

Parsl's memoizer keys a call by the ids of its arguments; here those ids
cover content: a shipped function by its bytes, a File by its URL and (for
inputs) the digest of its content, stage options with the code digest of a
script. ``StageMemoizer`` adds the rule Parsl cannot know: a hit stands only
if the stage directory still holds that call's files (``.call.json``, written
when the call succeeds, removed when any run of the stage starts), and it
logs why a stage runs again.
"""

from __future__ import annotations

import functools
import pickle
from pathlib import Path
from typing import Any

from ..core.log import get_logger
from . import identity
from .payload import ShippedFunction, StageOptions

#: Parsl's keyword arguments of a stage's bash app that are not the call's own
PARSL_KWARGS = ("inputs", "outputs", "stdout", "stderr", "parsl_resource_specification")
_digests: dict[str, Path | None] = {"cache": None}


def use_digest_cache(path: Path) -> None:
    """Where this process keeps input digests (the run directory's shared cache)."""
    _digests["cache"] = path


@functools.lru_cache(maxsize=1)
def register_memo_ids() -> None:
    """Register once per process (Parsl's ``id_for_memo`` is a singledispatch)."""
    from parsl.data_provider.files import File
    from parsl.dataflow.memoization import id_for_memo

    @id_for_memo.register(File)
    def _file(obj: File, output_ref: bool = False) -> bytes:
        if output_ref or obj.scheme != "file":
            return pickle.dumps(("File", obj.url))  # an output is named, not read
        return pickle.dumps(("File", obj.url, identity.file_digest(obj.filepath, _digests["cache"])))

    @id_for_memo.register(ShippedFunction)
    def _fn(obj: ShippedFunction, output_ref: bool = False) -> bytes:
        return pickle.dumps(("ShippedFunction", obj.name, identity.code_digest(obj.blob, None)))

    @id_for_memo.register(StageOptions)
    def _opts(obj: StageOptions, output_ref: bool = False) -> bytes:
        return pickle.dumps(("StageOptions", obj.stage_dir, obj.num_nodes, obj.ranks_per_node, obj.env,
                             obj.launcher_args, obj.code))


def call_arguments(args: tuple, kwargs: dict[str, Any]) -> bytes:
    """The call's own arguments, normalised as Parsl's memo ids (Files by content)."""
    from parsl.dataflow.memoization import id_for_memo

    register_memo_ids()
    own = {k: v for k, v in kwargs.items() if k not in PARSL_KWARGS}
    return id_for_memo((tuple(args), own))


def stage_components(opts: StageOptions, args: tuple, kwargs: dict[str, Any]) -> dict[str, str]:
    return identity.components(opts, call_arguments(args, kwargs), list(kwargs.get("inputs", ())))


def _stage_call(task: Any) -> tuple[Any, StageOptions, tuple, dict] | None:
    args = task["args"]
    if len(args) >= 3 and isinstance(args[2], StageOptions):
        fn, script, opts, *rest = args
        name = fn.name.rsplit(".", 1)[-1] if fn is not None else Path(str(script[1] if len(script) > 1
                                                                          else script[0])).name
        return name, opts, tuple(rest), task["kwargs"]
    return None


def stage_memoizer(checkpoint_files: list[str]) -> Any:
    """A Parsl memoizer for stages (Parsl's BasicMemoizer with the rules above)."""
    from parsl.dataflow.memoization import BasicMemoizer

    class StageMemoizer(BasicMemoizer):
        def start(self, *, run_dir: str, config_run_dir: str) -> None:
            use_digest_cache(identity.digest_cache(Path(config_run_dir).parent))
            super().start(run_dir=run_dir, config_run_dir=config_run_dir)

        def check_memo(self, task):
            result = super().check_memo(task)
            call = _stage_call(task)
            if call is None or task.get("hashsum") is None:
                return result
            function, opts, args, kwargs = call
            before = identity.read_call(opts.stage_dir)
            if result is not None and before is not None and before.get("memo_key") == task["hashsum"]:
                return result
            if task.get("try_id"):  # a retry or continuation: why it runs was said at its first try
                return None
            stage = Path(opts.stage_dir).name
            now = stage_components(opts, args, kwargs)
            get_logger("parsl_torch.workflow").info(
                "[%s] runs%s: %s", stage, " again" if before or result else "",
                identity.why_rerun(stage, function, before, now, result is not None))
            return None

        def update_memo_result(self, task, r):
            super().update_memo_result(task, r)
            call = _stage_call(task)
            if call is not None and task.get("hashsum"):
                _, opts, args, kwargs = call
                identity.write_call(opts.stage_dir, task["hashsum"], stage_components(opts, args, kwargs))

    return StageMemoizer(checkpoint_files=checkpoint_files, checkpoint_mode="task_exit")
