"""The cores that go with a stage's accelerators when it shares its node (``launch.pool`` grants both).

A node's cores are cut into as many equal blocks as it has accelerators, in their order: the
rank with local rank r gets the block of the r-th accelerator its stage holds, so that stages
beside each other never share cores (where a node has fewer cores than accelerators, blocks of
neighbouring accelerators are the same core). Who applies it depends on who binds the ranks:

- ``srun``: ``--exact`` and ``--cpus-per-task`` of a block's size; Slurm keeps the job's
  concurrent steps on disjoint cores.
- a machine whose binding lists each accelerator's cores (Aurora, Polaris): that list, cut to
  the held accelerators (the whole node's flags would put every stage on the same cores).
- otherwise (an mpiexec that does not bind, the local site): the shim pins each rank to its block.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..common import settings
from ..common.entrypoints import shim_at
from .machines import Machine


@dataclass(frozen=True)
class CpuShare:
    """Which of its node's ``total`` accelerators a stage holds, by position in the node's list."""

    positions: tuple[int, ...]
    total: int

    def __str__(self) -> str:
        return f"{','.join(map(str, self.positions))}/{self.total}"

    @classmethod
    def parse(cls, value: str | None) -> CpuShare | None:
        """``"2,3/4"`` (as ``str`` writes it); None for none or a value that is not one."""
        held, _, total = (value or "").partition("/")
        try:
            share = cls(tuple(int(p) for p in held.split(",")), int(total))
        except ValueError:
            return None
        return share if all(0 <= p < share.total for p in share.positions) else None

    def block(self, local_rank: int, cores: Sequence[int]) -> list[int]:
        """The cores of ``cores`` (the node's, in order) that local rank ``local_rank`` gets."""
        position, n = self.positions[local_rank % len(self.positions)], len(cores)
        first = position * n // self.total
        return list(cores[first:(position + 1) * n // self.total]) or [cores[first]]


#: the ranks' environment where the launcher binds them (the worker's share must not reach the shims)
_LAUNCHER_BINDS = {settings.CPU_SHARE.name: ""}


def bound(command: Sequence[str], share: CpuShare, machine: Machine | None,
          cpus_on_node: int) -> tuple[list[str], dict[str, str]]:
    """The launch command of a stage that holds ``share`` of its node, with binding flags that give
    its ranks their cores, and what the ranks' environment needs (the share, where the shim pins)."""
    command = list(command)
    if os.path.basename(command[0]) == "srun":
        # a step takes every CPU of its nodes by default: steps beside it would wait for them
        extra = [] if "--exact" in command else ["--exact"]
        if not any(a in ("-c", "--cpus-per-task") or a.startswith("--cpus-per-task=") for a in command):
            extra += ["--cpus-per-task", str(max(1, cpus_on_node // share.total))]
        return [command[0], *extra, *command[1:]], _LAUNCHER_BINDS
    if machine is not None and (cut := machine.shared_binding(share.positions)):
        whole = machine.binding_args(len(share.positions))
        at = shim_at(command) - 1 - len(whole)
        if whole and at >= 0 and command[at:at + len(whole)] == whole:
            return [*command[:at], *cut, *command[at + len(whole):]], _LAUNCHER_BINDS
    return command, {settings.CPU_SHARE.name: str(share)}



def pin(local_rank: int, value: str | None) -> list[int] | None:
    """Pin this process (a rank's shim, before it starts the rank) to its block of the node's cores;
    the cores, or None when the launch gave no share."""
    share = CpuShare.parse(value)
    if share is None or not hasattr(os, "sched_setaffinity"):
        return None
    cores = share.block(local_rank, sorted(os.sched_getaffinity(0)))
    os.sched_setaffinity(0, cores)
    return cores
