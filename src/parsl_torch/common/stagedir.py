"""A stage's directory: the files through which the processes of a stage talk.

The workflow, the Parsl worker, the supervisor, the shim and the ranks run in
different processes (often on different nodes); what one leaves for another is a
file here. This module owns the names of those files, one typed record per JSON
file, its atomic write, and one reader that names the file that is damaged and
what is wrong with it. docs/architecture.md ("What crosses a process boundary")
says who writes and who reads each.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from collections.abc import Iterable
from typing import Any, TypeVar

from ..errors import ParslTorchError
from .files import write_atomic

#: the identity of the call whose files the directory holds (written when it succeeded)
CALL = ".call.json"
#: who the call is that an attempt runs: left by its verdict (``apps.identity.verdict``), read by the attempt
IDENTITY = ".identity.json"
#: rank 0's record of where the stage stands (step, checkpoint time), for its continuation
CONTINUATION = ".continuation.json"
#: a sweep's ruling on the call at its last rung: go on, or stop and end as it is (``stages.sweep``; rank 0)
RULING = ".ruling.json"
#: a sweep's rungs: the steps at which the call's history reaches its file at once (left before it starts)
RUNGS = ".rungs.json"
#: the supervisor's record of the block an attempt runs in
BLOCK = ".block.json"
#: the supervisor's record of how the last launch ended (``common.outcome``)
OUTCOME = ".outcome.json"
#: touched when an attempt starts (``parsl-torch status``: running)
STARTED = ".started"
#: the stage's environment for the supervisor (0600: values may be secrets), and a script's argv for the shim
ENV, ARGV = ".env.json", ".argv.json"
#: a function stage's pickled call, and rank 0's return value
PAYLOAD, RESULT = "payload.pkl", "result.pkl"
#: on an endpoint: the user modules a remote function stage reaches, shipped with it (first on the ranks' path)
SOURCES = ".sources"
#: what the ranks' Python processes read, merged by the supervisor (``observe.recorder``)
READS = ".reads.json"
#: the files of the call before this one (a new call starts in an empty directory); PREVIOUS_PARTIAL while moving
PREVIOUS, PREVIOUS_PARTIAL = ".previous", ".previous.partial"
#: what the ranks print (earlier attempts: stdout.1.txt, ...)
STDOUT, STDERR = "stdout.txt", "stderr.txt"
#: beside each history file: rank 0's progress (``<history>.progress.json``)
PROGRESS_SUFFIX = ".progress.json"


class DamagedRecord(ParslTorchError):
    """A record file that exists but cannot be read as its record."""


@dataclass(frozen=True)
class CallRecord:
    memo_key: str
    components: dict[str, str]
    #: each declared output's digest when the call finished (an older record has none: not compared)
    outputs: dict[str, str] = field(default_factory=dict)
    #: what its ranks read, each by its digest when it finished (None: not observed; ``identity.reads``)
    reads: dict[str, str] | None = None


@dataclass(frozen=True)
class IdentityRecord:
    """The identity of the call an attempt runs (its ranks resume only a checkpoint written under the same
    ``call_id``)."""

    call_id: str


@dataclass(frozen=True)
class ReadsRecord:
    """What a call's ranks read (``f``/``F``/``d``/``e`` lines, ``observe.recorder``), over every launch of the
    call (``add_reads``), and how many of the last launch's ``expected`` ranks told it (fewer: not all was
    seen)."""

    ranks: int
    expected: int
    reads: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ContinuationRecord:
    """Written by rank 0 at each checkpoint under a block end, and when it stops for one."""

    call: str | None
    time: float
    step: int | None = None
    save_seconds: float | None = None
    grace: float | None = None


@dataclass(frozen=True)
class RulingRecord:
    """Written by a sweep when it judged the call at the rung of ``step``: it goes on (``keep``), or its
    ranks stop at the next step they agree on, keep what they wrote and end well (for good, or paused: a
    later ruling that keeps it, ``promoted``, and the call submitted again resume it from the checkpoint it
    stopped at). A ruling on another call of the stage is ignored."""

    call: str | None
    time: float
    step: int
    keep: bool
    why: str = ""
    promoted: bool = False


@dataclass(frozen=True)
class RungsRecord:
    """Written by a sweep before it submits a trial: the steps at which it judges it, and how often it looks
    at its trials (rank 0 at a rung looks for its ruling as often, not more)."""

    steps: list[int]
    poll_s: float = 0.2


@dataclass(frozen=True)
class BlockRecord:
    """Written by the supervisor when an attempt starts (``skipped``: the block was past its deadline)."""

    block: str | None
    end: float | None
    deadline: float | None
    started: float
    skipped: bool = False
    accelerators: str | None = None  # a stage that shares its node: what it holds ("CUDA_VISIBLE_DEVICES=2,3")


@dataclass(frozen=True)
class ProgressRecord:
    """Written by a History on rank 0 as the stage goes."""

    step: int
    total: int | None
    metric: str | None
    value: float | None
    time: float
    mfu: float | None = None  # a train stage's model FLOPs utilisation (where the device's peak is known)


@dataclass(frozen=True)
class WarmJob:
    """One call handed to a warm group (``apps.warm``), in the group's ``jobs/<n>.json``: the stage
    directory, whose files (``PAYLOAD``, ``ENV``, ``RESULT``, ``STDOUT``, ``STDERR``) its ranks read
    and write as a cold stage's do, and its walltime."""

    stage_dir: str
    walltime: float | None = None

    def file(self, name: str) -> str:
        return os.path.join(self.stage_dir, name)


@dataclass(frozen=True)
class WarmReport:
    """How one rank's child ran a warm call (``jobs/<n>.rank<r>.json``): its exit code (negative: the
    signal), the exception that ended it, whether its parent stopped it ("peer": another rank failed;
    "walltime"), and what it read (None: not observed)."""

    code: int
    host: str
    raised: str = ""
    stopped: str = ""
    reads: list[str] | None = None


R = TypeVar("R")
#: the JSON types an annotation allows (None is always allowed where the annotation says so)
_TYPES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "dict[str, str]": (dict,),
          "dict[str, Any]": (dict,), "list[str]": (list,)}


def to_json(record: Any) -> str:
    return record.to_json() if hasattr(record, "to_json") else json.dumps(asdict(record), sort_keys=True)


def from_dict(kind: type[R], data: Any) -> R:
    """``kind`` from a JSON object: every field without a default present, each of its type."""
    if hasattr(kind, "from_dict"):
        return kind.from_dict(data)
    if not isinstance(data, dict):
        raise ValueError(f"not a JSON object but {type(data).__name__}")
    values = {}
    for f in fields(kind):
        if f.name not in data:
            if f.default is f.default_factory:  # both MISSING: required
                raise ValueError(f"field {f.name!r} is missing")
            continue
        value, allowed = data[f.name], [t.strip() for t in str(f.type).split("|")]
        if not (value is None and "None" in allowed) and not any(
                isinstance(value, _TYPES.get(t, (object,))) and not (t in ("int", "float") and value is True)
                for t in allowed if t != "None"):
            raise ValueError(f"field {f.name!r} is {value!r}, not {f.type}")
        values[f.name] = value
    return kind(**values)


def write(path: str | os.PathLike, record: Any) -> None:
    """The record, whole or not at all (readers in other processes poll it)."""
    write_atomic(path, to_json(record))


def read(path: str | os.PathLike, kind: type[R]) -> R | None:
    """The record in ``path``; None when there is none. A file that is there but is not a
    ``kind`` raises DamagedRecord naming the file and what is wrong."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DamagedRecord(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        return from_dict(kind, json.loads(text))
    except (ValueError, TypeError, KeyError) as exc:
        raise DamagedRecord(f"{path}: damaged, not a {kind.__name__} record ({exc})") from None


def read_or_none(path: str | os.PathLike, kind: type[R], log: Any = None) -> R | None:
    """``read`` for pollers and best-effort readers: a damaged record is None (and a warning in ``log``)."""
    try:
        return read(path, kind)
    except DamagedRecord as exc:
        if log is not None:
            log.warning("%s: read as missing", exc)
        return None


def forget(path: str | os.PathLike) -> None:
    """An earlier attempt's record must not pass for this one's."""
    Path(path).unlink(missing_ok=True)


def add_reads(stage_dir: str | os.PathLike, lines: Iterable[str], ranks: int, expected: int) -> None:
    """A launch's reads added to the call's (``READS``): a call continued over blocks, retried or resumed read
    on from its earlier launches, so its record keeps every one's (the one merge of a cold supervisor's and a
    warm group's)."""
    path = Path(stage_dir, READS)
    earlier = read_or_none(path, ReadsRecord)
    write(path, ReadsRecord(ranks, expected, sorted({*lines, *(earlier.reads if earlier else ())})))
