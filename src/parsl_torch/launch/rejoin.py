"""The word that brings a spare in for a lost node while the other nodes' ranks stay up.

The supervisor (``supervise``) sends it down each node's heartbeat connection; the node's first shim
writes it to a node-local file (``node_file``) that every rank's prepared parent on the node watches
(``apps.stage.kept``): each one ends its training process, whatever collective it hangs in, and forks
a new one with the rank and the fresh rendezvous said here. A spare's waiting ranks learn their ranks
from it. Node-local: no shared file system is stat'ed by every rank many times a second.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..common import settings
from ..common.files import write_atomic
from .events import short


@dataclasses.dataclass(frozen=True)
class Rejoin:
    """Generation ``generation`` of a launch's ranks: their rendezvous (rank 0's node, which is the spare's
    where the lost node held rank 0, and a fresh port), the world size and each node's first rank (by short
    name, in the nodes' order)."""

    generation: int
    addr: str
    port: int
    world: int
    first: dict[str, int]

    def line(self) -> bytes:
        return (json.dumps({"rejoin": dataclasses.asdict(self)}) + "\n").encode()

    def rank_env(self, host: str, local_rank: int, local_world: int,
                 environ: Mapping[str, str] = os.environ) -> dict[str, str] | None:
        """A rank's torchrun variables in this generation (None: its node is not one of the launch's now); in a
        Slurm step, the step's nodes too (the ranks' record of where they ran: ``core.topology``)."""
        first = self.first.get(short(host))
        if first is None:
            return None
        rank = first + local_rank
        env = {"RANK": str(rank), "WORLD_SIZE": str(self.world), "GROUP_RANK": str(rank // max(local_world, 1)),
               "MASTER_ADDR": self.addr, "MASTER_PORT": str(self.port),
               settings.SHIM_SOURCE.name: f"rejoin:{rank}:{self.world}"}
        if "SLURM_STEP_NODELIST" in environ:
            env["SLURM_STEP_NODELIST"] = ",".join(self.first)
        return env


def token_of(address: str | None) -> str | None:
    """The launch's token, from the address its ranks report to (``host:port:token``)."""
    return address.rsplit(":", 2)[-1] if address and address.count(":") >= 2 else None


def node_file(token: str) -> Path:
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()
    return Path(base, f"parsl-torch-rejoin-{token}.json")


def take(line: bytes, token: str) -> bool:
    """A line from the supervisor, on a node's first shim: a rejoin is written for the node's ranks."""
    try:
        message = json.loads(line)
        word = Rejoin(**message["rejoin"])
    except (ValueError, TypeError, KeyError):
        return False
    write_atomic(node_file(token), json.dumps(dataclasses.asdict(word)))
    return True


def read(token: str) -> Rejoin | None:
    """The newest word on this node, if any."""
    try:
        return Rejoin(**json.loads(node_file(token).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def forget(token: str) -> None:
    node_file(token).unlink(missing_ok=True)
