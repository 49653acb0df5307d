"""The files a finished call left. A skip returns them, so it stands only while they are there and
as that call wrote them: an output deleted, or changed since (a checkpoint overwritten by hand, a
file copied over it), reruns the stage, which writes it again."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...common import stagedir


def _local(output: Any) -> bool:
    return getattr(output, "scheme", "file") == "file"


def output_digests(outputs: Sequence[Any], cache: Any) -> dict[str, str]:
    """Each declared output's digest as the call leaves it (``DigestCache.file_digest``: cached, so a
    stage that takes it as an input does not read it again)."""
    return {o.filepath: cache.file_digest(o.filepath) for o in outputs if _local(o)}


def spoiled_files(stage_dir: str | os.PathLike, function: bool, outputs: Sequence[Any],
                  before: stagedir.CallRecord, cache: Any) -> tuple[list[str], list[str]]:
    """(gone, changed): the finished call's files that are missing, and its outputs that differ from
    what it left (each declared output; for a function stage, rank 0's result too, which must be there),
    named relative to the stage directory where they are in it."""
    gone, changed = [], []
    for output in filter(_local, outputs):
        if not os.path.exists(output.filepath):
            gone.append(_shown(output.filepath, stage_dir))
        elif (left := before.outputs.get(output.filepath)) is not None and cache.file_digest(output.filepath) != left:
            changed.append(_shown(output.filepath, stage_dir))
    if function and not Path(stage_dir, stagedir.RESULT).exists():
        gone.append(f"return value ({stagedir.RESULT})")
    return gone, changed


#: the suffix of an output set aside because it was changed after its call wrote it
ASIDE_SUFFIX = ".changed"


def set_aside(stage_dir: str | os.PathLike, outputs: Sequence[Any], before: stagedir.CallRecord,
              cache: Any) -> list[str]:
    """Rename each output outside the stage's directory that differs from what its finished call left to
    ``<name>.changed`` (an older one replaced): the rerun then starts without it (a train stage would otherwise
    resume from a damaged checkpoint of its own call, and fail the same way at every rerun); those inside go
    to ``.previous/`` with the rest of the finished call's files (``freshdir``). Returns what was moved, as
    ``spoiled_files`` names it."""
    moved, inside = [], os.path.join(os.path.abspath(stage_dir), "")
    for output in filter(_local, outputs):
        if os.path.abspath(output.filepath).startswith(inside):
            continue
        left = before.outputs.get(output.filepath)
        if left is not None and os.path.exists(output.filepath) and cache.file_digest(output.filepath) != left:
            os.replace(output.filepath, output.filepath + ASIDE_SUFFIX)
            moved.append(f"{_shown(output.filepath, stage_dir)} -> {os.path.basename(output.filepath)}{ASIDE_SUFFIX}")
    return moved


def _shown(path: str, stage_dir: str | os.PathLike) -> str:
    relative = os.path.relpath(path, stage_dir)
    return f"output {path if relative.startswith('..') else relative}"
