"""parsl-torch's MPI task scheduler for a block's worker pool (``launch.pool`` installs it): Parsl's
``MPITaskScheduler``, but lost nodes are never handed out again, spares are held back for them, a
stage smaller than a node shares it on its own accelerators, and tasks are placed in the order
they came. Imports Parsl: only the worker pool's process loads it."""

from __future__ import annotations

import logging
import os
import pickle
import threading
from typing import Any

from parsl.executors.high_throughput.mpi_resource_management import (
    MPITaskScheduler,
    get_nodes_in_batchjob,
    identify_scheduler,
)

from . import quarantine
from .cpushare import CpuShare
from .events import short
from .packing import ACCELERATORS_KEY, CPU_SHARE_KEY, MIN_NODES_KEY, SHORT_KEY, SPARES_KEY, Grant, Slots

log = logging.getLogger("parsl.executors.high_throughput.process_worker_pool")


class _Lost:
    """This job's lost nodes, by short name (a node file may name hosts in full), read again only when
    the quarantine file changed (a placement decision costs a stat, not a read)."""

    def __init__(self, path: str) -> None:
        self.path, self.seen, self.nodes = path, None, frozenset()

    def __call__(self) -> frozenset[str]:
        try:
            st = os.stat(self.path)
            seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            seen = None
        if seen != self.seen or seen is None:
            self.seen = seen
            self.nodes = frozenset(short(n) for n in quarantine.lost_nodes(self.path, quarantine.job_of()))
        return self.nodes


class PoolScheduler(MPITaskScheduler):
    """Parsl's MPITaskScheduler with the block's nodes placed by ``packing.Slots``; ``pool.scheduler_class``
    makes the subclass that carries one block's settings (Parsl instantiates it by name)."""

    quarantine_path: str = ""  # the workflow's file of lost nodes
    spares: int = 0  # nodes held back for lost ones
    accelerators: tuple[str, ...] = ()  # each node's accelerators, shared by stages smaller than a node
    visibility: str = "CUDA_VISIBLE_DEVICES"  # the variable that narrows them

    def __init__(self, pending_task_q, pending_result_q) -> None:  # noqa: ANN001 - Parsl's signature
        self.pending_task_q, self.pending_result_q = pending_task_q, pending_result_q
        self.available_nodes = get_nodes_in_batchjob(identify_scheduler())
        self.slots = Slots(self.available_nodes, self.accelerators)
        held = min(self.spares, max(len(self.slots.entries) - 1, 0))
        self.spare_nodes = self.slots.entries[len(self.slots.entries) - held:]
        self.lost = _Lost(self.quarantine_path)
        self._usable_for: tuple[frozenset[str], int] | None = None  # (lost, spares) the cached set is for
        self._usable: set[str] = set()
        self.grants: dict[Any, Grant] = {}
        self.backlog: list[dict] = []
        self.lock = threading.Lock()
        log.info("parsl-torch: %d node(s)%s; spare node(s) held back: %s", len(self.slots.entries),
                 f", accelerators {','.join(self.accelerators)} on each, shared by stages smaller than a node"
                 if self.slots.accelerators else "", [Slots.name(e) for e in self.spare_nodes])

    def usable(self, lost: frozenset[str]) -> set[str]:
        """The entries neither lost nor held back (computed again only when either changes)."""
        if self._usable_for != (lost, len(self.spare_nodes)):
            spares = set(self.spare_nodes)
            self._usable = {e for e in self.slots.entries if short(Slots.name(e)) not in lost and e not in spares}
            self._usable_for = (lost, len(self.spare_nodes))
        return self._usable

    def put_task(self, task_package: dict) -> None:
        if not task_package.get("context", {}).get("resource_spec", {}).get("num_nodes"):
            return self.pending_task_q.put(task_package)
        with self.lock:
            self.backlog.append(task_package)
            self._place_backlog()
        return None

    def _place_backlog(self) -> None:
        """Place waiting tasks in the order they came, until one does not fit (the quarantine file
        is read once for them all)."""
        lost = self.lost()
        while self.backlog and self._place(self.backlog[0], lost):
            self.backlog.pop(0)

    def _place(self, task_package: dict, lost: frozenset[str]) -> bool:
        """Start the task (or fail it at once, saying why, if the block can never hold it); False
        when it must wait. A task that needs more nodes than the block has left starts on the nodes
        left if its ``min_nodes`` allows."""
        resources = task_package["context"]["resource_spec"]
        tid = task_package["task_id"]
        usable = self.usable(lost)
        needed = int(resources["num_nodes"])
        ranks_per_node = int(resources.get("ranks_per_node") or int(resources["num_ranks"]) // needed)
        left = len(usable)
        if needed > left and 0 < int(resources.get(MIN_NODES_KEY) or needed + 1) <= left:
            log.warning("parsl-torch: task %s asks for %d node(s), the block has %d left (%s lost): it starts "
                        "on %d (min_nodes %s)", tid, needed, left, ", ".join(sorted(lost)), left,
                        resources[MIN_NODES_KEY])
            needed = left
            resources.update(num_nodes=left, num_ranks=left * ranks_per_node)
        if needed > left:
            resources["MPI_NODELIST"], resources[ACCELERATORS_KEY], resources[CPU_SHARE_KEY] = "", "", ""
            resources[SHORT_KEY] = (f"the stage needs {needed} node(s) but its block has {left} left: "
                               f"{', '.join(sorted(lost)) or 'none'} lost in this job (quarantined), "
                               f"{len(self.spare_nodes)} spare(s) held back")
            self.grants[tid] = Grant(())
            self.pending_task_q.put(task_package)
            return True
        grant = self.slots.take(needed, ranks_per_node, usable)
        if grant is None:
            return False
        self.grants[tid] = grant
        resources["MPI_NODELIST"] = ",".join(Slots.name(e) for e in grant.nodes)
        resources[SHORT_KEY] = ""  # (a worker keeps the variables of its earlier tasks: each task sets its own)
        resources[SPARES_KEY] = ",".join(Slots.name(e) for e in self.spare_nodes)  # (its supervisor may claim one)
        resources[ACCELERATORS_KEY] = f"{self.visibility}={','.join(grant.accelerators)}" if grant.accelerators else ""
        resources[CPU_SHARE_KEY] = str(CpuShare(tuple(map(self.accelerators.index, grant.accelerators)),
                                           len(self.accelerators))) if grant.accelerators else ""
        if grant.accelerators:
            log.info("parsl-torch: task %s on %s, accelerators %s", tid, resources["MPI_NODELIST"],
                     ",".join(grant.accelerators))
        self.pending_task_q.put(task_package)
        return True

    def get_result(self, block: bool = True, timeout: float | None = None):  # noqa: ANN201 - Parsl's
        result_pkl = self.pending_result_q.get(block, timeout)
        if result_pkl is None:
            return None
        result = pickle.loads(result_pkl)
        if result["type"] == "result" and (grant := self.grants.pop(result["task_id"], None)) is not None:
            with self.lock:
                self._give_back(grant)
                self._place_backlog()
        return result_pkl

    def _give_back(self, grant: Grant) -> None:
        """A task's nodes go back, except lost ones: each lost node releases a spare (the one its supervisor
        claimed to go on in place, which is free now; else one held back), so the retry of the stage that
        lost it starts at once."""
        lost = self.lost()
        gone = [e for e in grant.nodes if short(Slots.name(e)) in lost]
        self.slots.give_back(grant)
        if not self.spare_nodes or not lost:  # (a spare is claimed only after a loss: no file read per task end)
            return
        names = [Slots.name(e) for e in self.spare_nodes]
        holder = ",".join(Slots.name(e) for e in grant.nodes)
        released = quarantine.release_spares(self.quarantine_path, quarantine.job_of() or "", names, holder, len(gone))
        entries = [next(e for e in self.spare_nodes if Slots.name(e) == name) for name in released]
        self.spare_nodes = [e for e in self.spare_nodes if e not in entries]
        if released:
            log.warning("parsl-torch: lost node(s) %s are not handed out again; spare(s) released: %s",
                        sorted(Slots.name(e) for e in gone), released)
