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

from . import stagedir


class Cause(str, enum.Enum):
    """Why a launch ended."""

    OK = "ok"
    RANK_FAILED = "rank_failed"  # a rank exited non-zero or was killed: ``rank``, ``host`` name it
    NODE_LOST = "node_lost"  # a node went silent or its processes vanished, and it did not answer a check
    RANKS_VANISHED = "ranks_vanished"  # a node's ranks ended (or fell silent) without a report, but it answers
    TIMED_OUT = "timed_out"  # the stage's walltime
    SIGNALLED = "signalled"  # the supervisor was told to stop (SIGTERM, SIGINT, SIGHUP)
    ORPHANED = "orphaned"  # the workflow that started the stage is gone
    CONTINUED = "continued"  # stopped for its block's end: it continues in the next block
    LAUNCHER_FAILED = "launcher_failed"  # the launcher exited non-zero and no rank said why
    TOO_FEW_NODES = "too_few_nodes"  # the block has fewer nodes left than the stage needs (lost ones quarantined)
    PREFLIGHT_FAILED = "preflight_failed"  # a node did not answer the pre-flight check (quarantined): not started
    NO_RESULT = "no_result"  # every rank exited 0 but rank 0 left no return value (a function stage)


@dataclass(frozen=True)
class Outcome:
    """The end of one launch: ``summary`` is the line people read, the other fields are what code reads."""

    cause: Cause
    exit_code: int
    summary: str
    rank: int | None = None
    host: str | None = None
    ranks: tuple[int, ...] = ()
    #: written before the lost node's check (of up to this many seconds) ended: not final (the check may
    #: find the node alive)
    checking: float = 0.0

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "cause": self.cause.value, "ranks": list(self.ranks)})

    @classmethod
    def from_dict(cls, data: dict) -> Outcome:
        return cls(Cause(data["cause"]), int(data["exit_code"]), str(data["summary"]), data.get("rank"),
                   data.get("host"), tuple(data.get("ranks") or ()), float(data.get("checking") or 0))


#: the exit code of a launch or a warm call that ran past its walltime (as coreutils' ``timeout``)
TIMEOUT_EXIT = 124


def timed_out(seconds: float) -> Outcome:
    """A launch or a warm call stopped at its walltime: one wording for both routes."""
    return Outcome(Cause.TIMED_OUT, TIMEOUT_EXIT, f"timed out after {seconds:g} s")


def continued(code: int, why: str = "stopped for the block's end", rank: int | None = None,
              host: str | None = None) -> Outcome:
    """A launch or a warm call that ended so that its stage continues in the next block (exit ``code``)."""
    return Outcome(Cause.CONTINUED, code, why, rank, host)


def write_outcome(stage_dir: str | os.PathLike, outcome: Outcome) -> None:
    with contextlib.suppress(OSError):  # the exit code still tells the workflow that it failed
        stagedir.write(Path(stage_dir) / stagedir.OUTCOME, outcome)


def forget_outcome(stage_dir: str | os.PathLike) -> None:
    """A launch starts: an earlier launch's outcome must not pass for its own."""
    stagedir.forget(Path(stage_dir) / stagedir.OUTCOME)


def read_outcome(stage_dir: str | os.PathLike, log: object = None) -> Outcome | None:
    """The last launch's outcome; None if none was recorded (a damaged record: None and a warning in ``log``)."""
    return stagedir.read_or_none(Path(stage_dir) / stagedir.OUTCOME, Outcome, log)
