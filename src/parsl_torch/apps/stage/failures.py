"""A failed stage's one error: which stage, which rank on which node, what exit code, and the
tail of its stderr (for a local stage's future and a remote stage's answer alike)."""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path

from ...common.blocks import CONTINUE_EXIT
from ...common.diskspace import NO_SPACE, free_text, space_error
from ...common.metadata import redact_text, secret_values
from ...common.stagedir import ENV
from ...common.outcome import Cause, read_outcome
from ...errors import StageError

_TAIL_LINES = 25


def stderr_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def _known_secrets(stage_dir: Path) -> list[str]:
    """The secret values this stage was given (its ``env=``, the site's environment: its private
    ``.env.json``) or the workflow has (its shell's ``HF_TOKEN``...)."""
    try:
        given = json.loads((stage_dir / ENV).read_text())
    except (OSError, ValueError):
        given = {}
    return secret_values({**os.environ, **(given if isinstance(given, dict) else {})})


def _unrecorded(stage_dir: Path | None) -> str:
    """A failure the launch left no record of: its directory may have had no room for one."""
    full = space_error(stage_dir) if stage_dir else None
    if full is None:
        return "a rank failed"
    return (f"a rank failed, and there is no room in its directory {stage_dir} ({full.strerror}; "
            f"{free_text(stage_dir)}) for what the stage writes (its outputs, its record, the end of stderr.txt): "
            f"free space there (or have the quota raised), then run again")


def stage_error(stage: str, exc: BaseException, stderr: Path | None, secrets: Collection[str] = ()) -> StageError:
    """One error that says which stage, which rank, what exit code, and shows stderr's tail (``secrets``: the
    workflow's stages' arguments named as secrets, redacted in it as the stage's own are)."""
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
    tail = redact_text(stderr_tail(stderr), [*_known_secrets(stderr.parent), *secrets]) if stderr else ""
    outcome = read_outcome(stderr.parent) if stderr else None  # the supervisor's record of the launch
    if isinstance(exc, BashExitFailure) and exc.exitcode == CONTINUE_EXIT and outcome is not None \
            and outcome.cause is Cause.CONTINUED:
        head = (f"stage {stage!r} stopped for its block's end (exit code {CONTINUE_EXIT}, its checkpoint saved) "
                f"but nothing submitted it again: inside pt.workflow without a parsl.load of your own, it "
                f"continues in the next block")
    elif isinstance(exc, BashExitFailure):
        # the supervisor's record names the cause (a lost node, not the ranks elsewhere it took down)
        what = outcome.summary if outcome is not None and outcome.cause is not Cause.OK else \
            _unrecorded(stderr.parent if stderr else None)
        head = f"stage {stage!r} failed: {what} (exit code {exc.exitcode})"
    elif isinstance(exc, OSError) and exc.errno in NO_SPACE and stderr:  # (Parsl's worker writing its files)
        head = (f"stage {stage!r} failed: {exc.strerror}, writing its files in {stderr.parent} "
                f"({free_text(stderr.parent)}): free space there (or have the quota raised), then run again")
    elif outcome is not None and outcome.cause is Cause.NODE_LOST:  # (the job ended under the supervisor)
        head = f"stage {stage!r} failed: {outcome.summary} (then {type(exc).__name__}: {exc})"
    else:
        head = f"stage {stage!r} failed: {type(exc).__name__}: {exc}"
    return StageError(f"{head}\n--- last lines of {stderr} ---\n{tail}" if tail else head)
