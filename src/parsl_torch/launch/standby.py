"""A spare's ranks, up and waiting from a stage's start, brought in for a lost node by a rejoin.

A cold function stage whose block holds spares (``mpi.spare_nodes``) starts, beside its ranks, the same
ranks' processes on each spare, prepared and waiting (``apps.stage.kept``). When the supervisor names a
node lost, ``bring_in`` claims a spare whose ranks wait, quarantines the lost node and sends every node
of the stage a rejoin (``rejoin``): the other nodes' ranks stay up and fork their training anew, the
spare's take the lost node's ranks, all at a fresh rendezvous, and the stage goes on from the state its
ranks kept in node memory. Nothing is launched: no launcher's start across the nodes, no import.

Where this cannot be (no spare's ranks wait, a second loss with none left, a launcher that ends the other
nodes' ranks with a lost node's), the supervisor falls back to a launch in place (``supervise``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import threading
import time
import queue
from collections.abc import Mapping

from ..common import settings
from ..common.procs import stop
from ..core.topology import free_port
from . import quarantine
from .events import LauncherExited, short
from .listener import RankListener
from .nodeloss import on_spare, relaunched
from .rejoin import Rejoin

#: the launchers whose ranks on the other nodes live on when one node is lost: hydra's and PALS's mpiexec
#: wait for the lost node's daemon, Cray's aprun likewise, and srun with ``--no-kill`` (else Slurm ends the
#: step's tasks everywhere once it marks the node down: ``kept``)
KEEPS_OTHERS = ("mpiexec", "aprun", "srun")


def kept(argv: list[str]) -> list[str]:
    """A launch command whose ranks on the other nodes live on when one node is lost."""
    if argv and os.path.basename(argv[0]) == "srun" and "--no-kill" not in argv:
        return [argv[0], "--no-kill", *argv[1:]]
    return list(argv)


@dataclasses.dataclass
class Standby:
    """The stage's ranks now (``given``: Parsl's launch prefix rewritten at each rejoin, on ``hosts``) and
    the spares whose ranks wait (each one's launch command)."""

    given: list[str]
    prefix: list[str]
    hosts: list[str]
    per_node: int
    spares: dict[str, list[str]]
    procs: dict[str, subprocess.Popen] = dataclasses.field(default_factory=dict)
    generation: int = 0

    @classmethod
    def of(cls, given: list[str], prefix: list[str], hosts: list[str], per_node: int,
           offered: list[str]) -> Standby | None:
        """Where a spare's ranks can wait beside the stage's: Parsl's launch of one of ``KEEPS_OTHERS``."""
        if not (prefix and os.path.basename(prefix[0]) in KEEPS_OTHERS and per_node):
            return None
        spares = {s: kept(placed[0]) for s in offered if s and (placed := relaunched(given, prefix, [s], per_node))}
        return cls(list(given), list(prefix), [h for h in hosts if h], per_node, spares) if spares else None

    def start(self, env: Mapping[str, str], events: queue.Queue) -> None:
        """The spares' waiting ranks, with the launch's environment (and its rendezvous address)."""
        for spare, argv in self.spares.items():
            proc = subprocess.Popen(argv, env={**env, settings.STANDBY.name: "1"}, start_new_session=True)
            self.procs[spare] = proc
            threading.Thread(target=lambda p=proc, s=spare: events.put(LauncherExited(p.wait(), s)),
                             daemon=True).start()

    def stop(self, grace: float) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                stop(proc, grace)

    def spare_named(self, host: str) -> str | None:
        """The spare ``host`` names (its ranks may say a longer or shorter name than the block's list)."""
        return next((s for s in self.spares if short(s) == short(host)), None)

    def waiting(self, host: str, listener: RankListener) -> bool:
        """Whether ``host`` is a spare whose ranks wait (said hello as such, not brought in)."""
        spare = self.spare_named(host)
        return spare is not None and short(spare) in listener.waiting and spare in self.procs

    def drop(self, host: str) -> None:
        """A spare whose waiting ranks ended or went silent: not brought in."""
        spare = self.spare_named(host)
        self.spares.pop(spare or host, None)
        proc = self.procs.pop(spare or host, None)
        if proc is not None and proc.poll() is None:
            stop(proc, 1.0)

    def bring_in(self, lost: str, ranks: tuple[int, ...], summary: str, listener: RankListener) -> str | None:
        """After ``lost`` (with ``ranks``) is named lost: a waiting spare claimed, the lost node quarantined,
        every node told to rejoin; the spare, or None where none waits (nothing is changed then)."""
        path, job = settings.QUARANTINE.get(), quarantine.job_of()
        ready = [s for s in self.spares if self.waiting(s, listener) and self.procs[s].poll() is None]
        if short(lost) not in map(short, self.hosts) or not (ready and path and job):
            return None
        spare = quarantine.claim_spare(path, job, ready, os.environ.get("PARSL_MPI_NODELIST", ""))
        placed = on_spare(self.given, self.prefix, self.hosts, next(h for h in self.hosts if short(h) == short(lost)),
                          spare, self.per_node) if spare else None
        if spare is None or placed is None:
            return None
        quarantine.add(path, job, lost, summary)  # (now: no other stage of the block is handed it)
        self.given, self.hosts = placed
        self.generation += 1
        word = Rejoin(self.generation, self.hosts[0], free_port(), len(self.hosts) * self.per_node,
                      {short(h): i * self.per_node for i, h in enumerate(self.hosts)})
        listener.adopt(spare, ranks)
        for host in self.hosts:  # (a node that cannot be told is lost too: named in its turn)
            listener.send(host, word.line())
        return spare

    def close(self, wait_s: float) -> None:
        """At the stage's end after a rejoin: the spares brought in have ``wait_s`` to end with their ranks."""
        deadline = time.monotonic() + wait_s
        for spare, proc in self.procs.items():
            if spare in self.hosts:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(deadline - time.monotonic(), 0.0))
        self.stop(1.0)

    def finished(self, listener: RankListener) -> bool:
        """After a rejoin: every node's first shim said bye (their ranks ended; the launcher may wait for the
        lost node's daemon for ever)."""
        return self.generation > 0 and all(short(h) in listener.byes for h in self.hosts)
