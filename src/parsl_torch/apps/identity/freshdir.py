"""A new computation of a stage starts in an empty stage directory: the one decision "new computation, or
a continuation of the one whose files are here", for every route (cold, warm, remote).

A stage that runs again for any change (its code, arguments or options: its identity; or anything it read)
must not find the previous computation's files: a resumable script would resume that computation's snapshot
and return its result as this one's. Its files go to ``<stage>/.previous/`` (the latest one's only). Only a
continuation of the *same* computation keeps its directory: the next batch block, a retry (a lost node, a
Parsl retry), a rerun after a kill, a sweep's promotion; that is, the same identity, not finished, and
nothing it was seen to read changed since it read it. A computation's id is its call's identity (the memo
key), with ``~N`` after it for the N-th new computation of the same identity; the directory's owner is the
id named in its ``.env.json``, which every attempt writes when it starts, and the id the ranks resume a
checkpoint under (``PARSL_TORCH_CALL_ID``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from ...common import settings
from ...common.stagedir import CALL, ENV, IDENTITY, PREVIOUS, PREVIOUS_PARTIAL, RUNGS, SOURCES
from . import call_id
from .reads import RunFiles, changed_while_running, recorded

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


def computation(stage_dir: str | os.PathLike, parts: Mapping[str, str]) -> tuple[str, str | None]:
    """The computation an attempt of the call whose identity is ``parts`` runs: (its id, None) when it
    continues the one whose files the directory holds, else (a new id, why the old one is not continued: None
    where its identity differs, or no attempt started). A module of its identity's (``module <path>``) is
    judged there, by its syntax tree: a comment edited in it is no change. Reads only."""
    held, key = owner(stage_dir), call_id(parts)
    if held is None or held.partition("~")[0] != key:
        return key, None
    judged = RunFiles(os.fspath(stage_dir))
    if Path(stage_dir, CALL).exists():
        why = "the last one finished"
    elif changed := changed_while_running(_reads(stage_dir), lambda p: judged(p) or f"module {p}" in parts):
        why = f"{changed[0]}{' (and more)' if len(changed) > 1 else ''} changed since the unfinished one read it"
    else:
        return held, None
    number = held.partition("~")[2]
    return f"{key}~{int(number) + 1 if number.isdigit() else 1}", why


def _reads(stage_dir: str | os.PathLike) -> list[str]:
    """What the directory's unfinished computation was seen to read so far (its earlier launches')."""
    record = recorded(stage_dir)
    return record.reads if record is not None else []


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
