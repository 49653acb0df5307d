"""How a stage's launch ended: one record that the supervisor writes into the stage's
directory and the workflow reads, so that a stage's error is decided from data, never
from a message scraped out of a rank's or a launcher's output (rewording a line then
cannot break an error)."""

from __future__ import annotations

import contextlib
import enum
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from .files import write_atomic

#: in a stage's directory: the outcome of its last launch
OUTCOME_FILE = ".outcome.json"


class Cause(str, enum.Enum):
    """Why a launch ended."""

    OK = "ok"
    RANK_FAILED = "rank_failed"  # a rank exited non-zero or was killed: ``rank``, ``host`` name it
    NODE_LOST = "node_lost"  # a node went silent or its processes vanished: ``host``, ``ranks``
    TIMED_OUT = "timed_out"  # the stage's walltime
    SIGNALLED = "signalled"  # the supervisor was told to stop (SIGTERM, SIGINT, SIGHUP)
    ORPHANED = "orphaned"  # the workflow that started the stage is gone
    CONTINUED = "continued"  # stopped for its block's end: it continues in the next block
    LAUNCHER_FAILED = "launcher_failed"  # the launcher exited non-zero and no rank said why


@dataclass(frozen=True)
class Outcome:
    """The end of one launch: ``summary`` is the line people read, the other fields are what code reads."""

    cause: Cause
    exit_code: int
    summary: str
    rank: int | None = None
    host: str | None = None
    ranks: tuple[int, ...] = ()

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "cause": self.cause.value, "ranks": list(self.ranks)})

    @classmethod
    def from_json(cls, text: str) -> Outcome:
        data = json.loads(text)
        return cls(Cause(data["cause"]), int(data["exit_code"]), str(data["summary"]), data.get("rank"),
                   data.get("host"), tuple(data.get("ranks") or ()))


def write_outcome(stage_dir: str | os.PathLike, outcome: Outcome) -> None:
    with contextlib.suppress(OSError):  # the exit code still tells the workflow that it failed
        write_atomic(Path(stage_dir) / OUTCOME_FILE, outcome.to_json())


def forget_outcome(stage_dir: str | os.PathLike) -> None:
    """A launch starts: an earlier launch's outcome must not pass for its own."""
    with contextlib.suppress(FileNotFoundError):
        (Path(stage_dir) / OUTCOME_FILE).unlink()


def read_outcome(stage_dir: str | os.PathLike) -> Outcome | None:
    """The last launch's outcome; None if none was recorded (or the record is damaged)."""
    try:
        return Outcome.from_json((Path(stage_dir) / OUTCOME_FILE).read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None
