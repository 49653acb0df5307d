"""Which nodes of a block, and which of their accelerators, a stage gets (``launch.pool`` asks).

A node is handed out whole, as Parsl's MPI mode does, except where the site knows its nodes'
accelerators (``launch.accelerators``, a machine record, or the GPUs the local site sees) and
a stage needs fewer: a one-node stage with fewer ranks than the node has accelerators gets
that many accelerators of a node, and the node's other accelerators go to other such stages
at once. Never two stages on one accelerator; a stage that needs whole
nodes waits until they are whole. Stages are placed in the order they came (FIFO): a stage
that waits holds up the ones behind it, so a whole-node stage is never starved by a stream of
small ones (Parsl's own backlog places the smallest first).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..common import settings

#: a key of a task's resource specification, which Parsl's worker exports as PARSL_<KEY>: why the
#: block cannot give the stage its nodes
SHORT_KEY = settings.NODES_SHORT.name.removeprefix("PARSL_").lower()
#: the key for the spare nodes the block holds back as the stage starts (its supervisor may claim one)
SPARES_KEY = settings.SPARES.name.removeprefix("PARSL_").lower()
#: the resource specification's key for a stage's ``min_nodes`` (its executor lets it through)
MIN_NODES_KEY = "min_nodes"
#: the key for the accelerators a stage that shares its node holds ("CUDA_VISIBLE_DEVICES=2,3")
ACCELERATORS_KEY = settings.ACCELERATORS.name.removeprefix("PARSL_").lower()
#: the key for their positions among the node's ("2,3/4"), for the cores that go with them (``cpushare``)
CPU_SHARE_KEY = settings.CPU_SHARE.name.removeprefix("PARSL_").lower()


@dataclass(frozen=True)
class Grant:
    """What a stage was given: its nodes (entries of the block's node list), and for a stage that
    shares its node, the accelerators it holds there (empty: whole nodes)."""

    nodes: tuple[str, ...]
    accelerators: tuple[str, ...] = ()


class Slots:
    """The block's nodes and their free accelerators. Without accelerators each entry of the node list
    is one slot (the local site on a machine without GPUs lists its host once per stage it may run
    at once); with them a node is one entry, whatever the node list repeats."""

    def __init__(self, nodes: list[str], accelerators: tuple[str, ...] = ()) -> None:
        self.accelerators = tuple(accelerators)
        # a node name once when nodes are shared by accelerator; else each entry is a slot of its own
        self.entries = list(dict.fromkeys(nodes)) if self.accelerators else [f"{n}#{i}" for i, n in enumerate(nodes)]
        self._free = {e: list(self.accelerators) or [""] for e in self.entries}
        self._index = {e: i for i, e in enumerate(self.entries)}
        self._whole = set(self.entries)  # the entries with nothing taken (a decision is O(free), not O(block))

    @staticmethod
    def name(entry: str) -> str:
        return entry.split("#", 1)[0]

    def shares(self, num_nodes: int, ranks_per_node: int) -> bool:
        """Whether a stage of this shape shares its node with others."""
        return num_nodes == 1 and 0 < ranks_per_node < len(self.accelerators)

    def whole(self, usable: set[str], count: int) -> list[str]:
        """The first ``count`` usable entries with nothing taken, in the block's order."""
        return heapq.nsmallest(count, self._whole & usable, key=self._index.__getitem__)

    def take(self, num_nodes: int, ranks_per_node: int, usable: set[str]) -> Grant | None:
        """A grant for the stage from ``usable`` entries, or None when it does not fit now."""
        if self.shares(num_nodes, ranks_per_node):
            fits = [e for e in self.entries if e in usable and len(self._free[e]) >= ranks_per_node]
            if not fits:
                return None
            entry = min(fits, key=lambda e: len(self._free[e]))  # the fullest that fits: whole nodes stay whole
            given, self._free[entry] = self._free[entry][:ranks_per_node], self._free[entry][ranks_per_node:]
            self._whole.discard(entry)
            return Grant((entry,), tuple(given))
        whole = self.whole(usable, num_nodes)
        if len(whole) < num_nodes:
            return None
        for entry in whole:
            self._free[entry] = []
            self._whole.discard(entry)
        return Grant(tuple(whole))

    def give_back(self, grant: Grant) -> None:
        order = {a: i for i, a in enumerate(self.accelerators)}
        full = len(self.accelerators) or 1
        for entry in grant.nodes:
            back = list(grant.accelerators) if grant.accelerators else list(self.accelerators) or [""]
            self._free[entry] = sorted(self._free[entry] + back, key=lambda a: order.get(a, 0))
            if len(self._free[entry]) == full:
                self._whole.add(entry)

    def held(self, entry: str) -> list[str]:
        """The accelerators of ``entry`` that stages hold now."""
        return [a for a in self.accelerators if a not in self._free[entry]]
