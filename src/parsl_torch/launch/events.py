"""What a launch's supervisor hears while its ranks run: the listener's events (``listener``, sent by
the ranks' shims) and the launcher's exit. Each says itself in one place (``str``, ``describe``), so a
line in a stage's stderr and its error read the same."""

from __future__ import annotations

import queue
import signal
import time
from dataclasses import dataclass, replace
from typing import Any

from ..common.outcome import Cause, Outcome
from ..common.raised import RAISED_CHARS


def short(host: str) -> str:
    """A node's short name: ranks, launchers and batch systems spell a node with or without its domain."""
    return str(host).split(".")[0]


#: a node was lost (EX_TEMPFAIL: a retry on other nodes may succeed)
NODE_LOST_EXIT = 75


def describe_exit(code: int) -> str:
    """``exited with code 3``, ``was killed by SIGKILL`` (a negative code: the signal)."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def ranks_text(ranks: tuple[int, ...]) -> str:
    """A node's ranks, as the hello gave them (first, last)."""
    if len(ranks) == 2 and ranks[1] > ranks[0]:
        return f"ranks {ranks[0]}-{ranks[1]}" if ranks[1] > ranks[0] + 1 else f"ranks {ranks[0]}, {ranks[1]}"
    return f"rank {ranks[0]}" if ranks else "its ranks"


@dataclass(frozen=True)
class RankReport:
    """A rank's shim: its command ended with ``code`` (a failure), or, with ``preflight``, the node
    answered a pre-flight check. ``raised``: the exception that ended the rank (a function stage's,
    or a script's that called ``setup_torch``), one line (``common.raised``), so that the stage's error names it whatever its stderr's tail holds."""

    rank: int | None
    host: str
    code: int = 0
    preflight: bool = False
    raised: str = ""
    stopped: str = ""  # what a rank that was stopped by a signal did to its peers (``blame_stopped``)

    @classmethod
    def of(cls, message: dict[str, Any]) -> RankReport:
        code, raised = message.get("code"), message.get("raised")
        return cls(message.get("rank"), str(message.get("host", "?")), code if isinstance(code, int) else 1,
                   bool(message.get("preflight")), raised[:RAISED_CHARS] if isinstance(raised, str) else "")

    def __str__(self) -> str:
        if self.stopped:
            return f"rank {self.rank} on {self.host} {self.stopped}"
        if self.raised:
            return f"rank {self.rank} on {self.host} raised {self.raised}"
        return f"rank {self.rank} on {self.host} {describe_exit(self.code)}"


def blame_stopped(report: RankReport, stopped: dict[int, tuple[str, float]]) -> RankReport:
    """The rank to name for ``report``'s failure: the one its shim saw stopped by a signal (its peers time out
    waiting for it, and would be named instead), else ``report``'s own."""
    others = {rank: seen for rank, seen in stopped.items() if rank != report.rank}
    if not others:
        return report
    rank, (host, since) = min(others.items(), key=lambda item: item[1][1])
    when = time.strftime("%H:%M:%S", time.localtime(since))
    return RankReport(rank, host, report.code, stopped=f"was stopped by a signal (SIGSTOP or SIGTSTP) at {when} "
                                                       f"and stopped answering its peers; then {report}")


def cause_within(events: queue.Queue, wait: float, first: RankReport) -> NodeSilent | RankReport | None:
    """What made ``first`` fail, if it is heard within ``wait`` seconds (other events are dropped): a lost
    node, or, unless ``first`` is one, a rank killed by SIGKILL (the OOM killer, ``kill -9``: its peers
    raise at once, gloo's "Connection closed by peer", and on a loaded machine their report may come
    before its own). Not a rank ended by another signal: a launcher may forward SIGTERM to the other
    ranks once one has failed."""
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        try:
            event = events.get(timeout=left)
        except queue.Empty:
            return None
        if isinstance(event, NodeSilent) or (isinstance(event, RankReport) and _killed(event) and not _killed(first)):
            return event
    return None


def _killed(report: RankReport) -> bool:
    return report.code == -signal.SIGKILL and not report.raised and not report.preflight


@dataclass(frozen=True)
class NodeSilent:
    """A node whose ranks stopped talking: ``lost`` (no heartbeat for ``silent_s``), ``vanished`` (its
    connection closed without a bye), or ``silent`` (its ranks never said hello, and the launcher
    ended the ranks on ``victim``: ``nodeloss.blame`` names it)."""

    kind: str
    host: str
    ranks: tuple[int, ...] = ()
    silent_s: float = 0.0
    victim: str = ""

    def describe(self, lost: bool = True) -> str:
        """The line that names the node and its ranks (stage errors quote it); ``lost=False``: before
        the node was checked."""
        named = " lost" if lost else ""
        what = f"node {self.host}{named} ({ranks_text(self.ranks)})"
        if self.kind == "lost":
            return f"{what}: no heartbeat for {self.silent_s:g} s (node down or its network cut)"
        if self.kind == "silent":
            return (f"node {self.host}{named}: its ranks never reached the launch, and the launcher ended the "
                    f"ranks on {self.victim} (node down or its network cut)")
        return f"{what}: its ranks' processes ended without a report (node down or killed)"

    def outcome(self) -> Outcome:
        return Outcome(Cause.NODE_LOST, NODE_LOST_EXIT, self.describe(), host=self.host, ranks=self.ranks)

    def blamed_on(self, host: str) -> NodeSilent:
        """This loss, named on ``host`` (one that never said hello) instead."""
        return replace(self, kind="silent", host=host, ranks=(), victim=self.host)


@dataclass(frozen=True)
class LauncherExited:
    """The launcher (mpiexec, srun) ended, with ``code``; ``spare``: the launcher of a spare's waiting ranks
    (``standby``)."""

    code: int
    spare: str = ""


Event = RankReport | NodeSilent | LauncherExited
