"""``parsl-torch-pool [--spares N] [--path DIR ...] QUARANTINE -- ARGS``: Parsl's worker pool (its
``process_worker_pool.py ARGS``), except that a node the block lost is not handed out again,
and its workers import from the workflow's own folders (``--path``: a stage's arguments may hold
objects of the workflow's modules, which the worker unpickles).

Parsl's MPI task scheduler puts a task's nodes back in the block's free pool when the task
ends, without a health check (node failures inside a block are out of Parsl's scope: its
issue #529): a stage placed on a lost node after it hangs, and the block is crippled without
a word. Here a task's nodes go back only if the stage's supervisor did not record them lost
in ``QUARANTINE`` (``launch.quarantine``); the block goes on with the nodes left, and a task
that needs more nodes than are left fails at once, saying so (it would wait forever).
``--spares N``: the block's last N nodes are held back from the start; each node lost
releases one, so the retry of the stage that lost it finds a node at once.
``--accelerators 0,1,2,3 --visibility CUDA_VISIBLE_DEVICES``: each node's accelerators; a
one-node stage with fewer ranks than that shares its node, holding its own accelerators
(``launch.packing``), which its supervisor makes the only ones its ranks see.
Tasks are placed in the order they came: one that waits holds up the ones behind it.
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys
import threading
from typing import Any

from ..common import settings
from . import quarantine
from .cpushare import CpuShare
from .packing import Grant, Slots

#: a key of a task's resource specification, which Parsl's worker exports as PARSL_<KEY>
SHORT_KEY = settings.NODES_SHORT.name.removeprefix("PARSL_").lower()
#: the resource specification's key for a stage's ``min_nodes`` (its executor lets it through)
MIN_NODES_KEY = "min_nodes"
#: the key for the accelerators a stage that shares its node holds ("CUDA_VISIBLE_DEVICES=2,3")
ACCELERATORS_KEY = settings.ACCELERATORS.name.removeprefix("PARSL_").lower()
CPU_SHARE_KEY = settings.CPU_SHARE.name.removeprefix("PARSL_").lower()


def _lost(path: str) -> set[str]:
    """This job's lost nodes, by short name (a node file may name hosts in full)."""
    return {n.split(".")[0] for n in quarantine.lost_nodes(path, quarantine.job_of())}


def scheduler_class(path: str, spares: int, accelerators: tuple[str, ...], visibility: str) -> type:
    """Parsl's MPITaskScheduler with the block's nodes placed by ``packing.Slots``."""
    import pickle

    from parsl.executors.high_throughput.mpi_resource_management import (
        MPITaskScheduler,
        get_nodes_in_batchjob,
        identify_scheduler,
    )

    log = logging.getLogger("parsl.executors.high_throughput.process_worker_pool")

    class PoolScheduler(MPITaskScheduler):
        def __init__(self, pending_task_q, pending_result_q) -> None:  # noqa: ANN001 - Parsl's signature
            self.pending_task_q, self.pending_result_q = pending_task_q, pending_result_q
            self.available_nodes = get_nodes_in_batchjob(identify_scheduler())
            self.slots = Slots(self.available_nodes, accelerators)
            held = min(spares, max(len(self.slots.entries) - 1, 0))
            self.spare_nodes = self.slots.entries[len(self.slots.entries) - held:]
            self.grants: dict[Any, Grant] = {}
            self.backlog: list[dict] = []
            self.lock = threading.Lock()
            log.info("parsl-torch: %d node(s)%s; spare node(s) held back: %s", len(self.slots.entries),
                     f", accelerators {','.join(accelerators)} on each, shared by stages smaller than a node"
                     if self.slots.accelerators else "", [Slots.name(e) for e in self.spare_nodes])

        def _usable(self, lost: set[str]) -> set[str]:
            return {e for e in self.slots.entries
                    if Slots.name(e).split(".")[0] not in lost and e not in self.spare_nodes}

        def put_task(self, task_package: dict) -> None:
            spec = task_package.get("context", {}).get("resource_spec", {})
            if not spec.get("num_nodes"):
                return self.pending_task_q.put(task_package)
            with self.lock:
                self.backlog.append(task_package)
                self._place_backlog()
            return None

        def _place_backlog(self) -> None:
            """Place waiting tasks in the order they came, until one does not fit (the quarantine file
            is read once for them all)."""
            lost = _lost(path)
            while self.backlog:
                if not self._place(self.backlog[0], lost):
                    return
                self.backlog.pop(0)

        def _place(self, task_package: dict, lost: set[str]) -> bool:
            """Start the task (or fail it at once, saying why, if the block can never hold it); False
            when it must wait. A task that needs more nodes than the block has left starts on the nodes
            left if its ``min_nodes`` allows."""
            spec = task_package["context"]["resource_spec"]
            tid = task_package["task_id"]
            usable = self._usable(lost)
            needed = int(spec["num_nodes"])
            ranks_per_node = int(spec.get("ranks_per_node") or int(spec["num_ranks"]) // needed)
            left = len(usable)
            if needed > left and 0 < int(spec.get(MIN_NODES_KEY) or needed + 1) <= left:
                log.warning("parsl-torch: task %s asks for %d node(s), the block has %d left (%s lost): it starts "
                            "on %d (min_nodes %s)", tid, needed, left, ", ".join(sorted(lost)), left,
                            spec[MIN_NODES_KEY])
                needed = left
                spec.update(num_nodes=left, num_ranks=left * ranks_per_node)
            if needed > left:
                spec["MPI_NODELIST"], spec[ACCELERATORS_KEY], spec[CPU_SHARE_KEY] = "", "", ""
                spec[SHORT_KEY] = (f"the stage needs {needed} node(s) but its block has {left} left: "
                                   f"{', '.join(sorted(lost)) or 'none'} lost in this job (quarantined), "
                                   f"{len(self.spare_nodes)} spare(s) held back")
                self.grants[tid] = Grant(())
                self.pending_task_q.put(task_package)
                return True
            grant = self.slots.take(needed, ranks_per_node, usable)
            if grant is None:
                return False
            self.grants[tid] = grant
            spec["MPI_NODELIST"] = ",".join(Slots.name(e) for e in grant.nodes)
            spec[SHORT_KEY] = ""  # (a worker keeps the variables of its earlier tasks: each task sets its own)
            spec[ACCELERATORS_KEY] = f"{visibility}={','.join(grant.accelerators)}" if grant.accelerators else ""
            spec[CPU_SHARE_KEY] = str(CpuShare(tuple(map(accelerators.index, grant.accelerators)),
                                               len(accelerators))) if grant.accelerators else ""
            if grant.accelerators:
                log.info("parsl-torch: task %s on %s, accelerators %s", tid, spec["MPI_NODELIST"],
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
            """A task's nodes go back, except lost ones: each lost node releases a spare, so the retry of
            the stage that lost it starts at once."""
            lost = _lost(path)
            gone = [e for e in grant.nodes if Slots.name(e).split(".")[0] in lost]
            self.slots.give_back(grant)
            if gone:
                released = [self.spare_nodes.pop() for _ in range(min(len(gone), len(self.spare_nodes)))]
                log.warning("parsl-torch: lost node(s) %s are not handed out again; spare(s) released: %s",
                            sorted(Slots.name(e) for e in gone), [Slots.name(e) for e in released])

    return PoolScheduler


def _place_with_slots(path: str, spares: int, accelerators: tuple[str, ...], visibility: str) -> None:
    from parsl.executors.high_throughput import mpi_resource_management

    # the worker pool's module imports the class by name when it runs: this one is found there
    mpi_resource_management.MPITaskScheduler = scheduler_class(path, spares, accelerators, visibility)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        sys.exit("usage: parsl-torch-pool [--spares N] [--path DIR ...] QUARANTINE -- PROCESS_WORKER_POOL_ARGS "
                 "(set by pt.workflow)")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="parsl-torch-pool")
    parser.add_argument("--spares", type=int, default=0, help="nodes per block held back for lost ones")
    parser.add_argument("--path", action="append", default=[], help="a folder the workers import from")
    parser.add_argument("--accelerators", default="", help="each node's accelerators (ids, comma-separated)")
    parser.add_argument("--visibility", default="CUDA_VISIBLE_DEVICES", help="the variable that narrows them")
    parser.add_argument("--machine", help="the nodes' machine (its binding gives a shared node's cores out)")
    parser.add_argument("quarantine", help="the workflow's file of lost nodes")
    opts = parser.parse_args(argv[:split])
    os.environ[settings.QUARANTINE.name] = opts.quarantine  # the stages' supervisors record lost nodes there
    if opts.machine:
        os.environ[settings.MACHINE.name] = opts.machine
    if opts.path:  # for this process and the workers it starts (spawned: they read PYTHONPATH)
        sys.path[:0] = opts.path
        os.environ["PYTHONPATH"] = os.pathsep.join([*opts.path, *filter(None, [os.environ.get("PYTHONPATH")])])
    _place_with_slots(opts.quarantine, opts.spares, tuple(filter(None, opts.accelerators.split(","))),
                      opts.visibility)
    sys.argv = ["process_worker_pool.py", *argv[split + 1:]]
    runpy.run_module("parsl.executors.high_throughput.process_worker_pool", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
