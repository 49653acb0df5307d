"""A new call of a stage starts in an empty stage directory.

A stage that runs because its identity changed must not find the previous
call's files: a resumable script would resume that call's snapshot and return
its result as this one's. Its files go to ``<stage>/.previous/`` (the latest
call's only). A continuation or retry of the *same* call (a lost node, the
next batch block, a Parsl retry) keeps its directory. The directory's owner
is the call named in its ``.env.json``, which every attempt writes when it starts.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..common import settings
from ..common.stagedir import ENV, IDENTITY, PREVIOUS, PREVIOUS_PARTIAL, RUNGS, SOURCES

#: kept where they are: this attempt's own (its identity, a remote stage's shipped modules and a sweep's
#: rungs are left before it starts)
_STAYS = frozenset({PREVIOUS, PREVIOUS_PARTIAL, SOURCES, IDENTITY, RUNGS})


def owner(stage_dir: str | os.PathLike) -> str | None:
    """The call whose files the directory holds (None: no attempt of any call started there)."""
    try:
        value = json.loads(Path(stage_dir, ENV).read_text()).get(settings.CALL_ID.name)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def is_new_call(stage_dir: str | os.PathLike, call_id: str) -> bool:
    """True when the directory holds another call's files (or a move of them was cut short)."""
    before = owner(stage_dir)
    return (before is not None and before != call_id) or Path(stage_dir, PREVIOUS_PARTIAL).exists()


def start_fresh(stage_dir: str | os.PathLike, call_id: str) -> list[str]:
    """Move another call's files to ``.previous/`` (replacing the one before); the names moved. Safe to
    cut short: the owner's record moves last, and a partial move is finished by the next attempt."""
    stage_dir = Path(stage_dir)
    if not is_new_call(stage_dir, call_id):
        return []
    partial = stage_dir / PREVIOUS_PARTIAL
    partial.mkdir(exist_ok=True)
    names = sorted(p.name for p in stage_dir.iterdir() if p.name not in _STAYS)
    for name in sorted(names, key=lambda n: n == ENV):  # the owner's record last
        target = partial / name  # (there already: from a move that was cut short, and since rewritten)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        os.replace(stage_dir / name, target)
    shutil.rmtree(stage_dir / PREVIOUS, ignore_errors=True)
    os.replace(partial, stage_dir / PREVIOUS)
    return names
