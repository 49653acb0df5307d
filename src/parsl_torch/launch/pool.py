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
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys

from ..common import settings
from . import quarantine

#: a key of a task's resource specification, which Parsl's worker exports as PARSL_<KEY>
SHORT_KEY = settings.NODES_SHORT.name.removeprefix("PARSL_").lower()
#: the resource specification's key for a stage's ``min_nodes`` (its executor lets it through)
MIN_NODES_KEY = "min_nodes"


def _lost(path: str) -> set[str]:
    """This job's lost nodes, by short name (a node file may name hosts in full)."""
    return {n.split(".")[0] for n in quarantine.lost_nodes(path, quarantine.job_of())}


def _keep_lost_nodes_out(path: str, spares: int) -> None:
    from parsl.executors.high_throughput.mpi_resource_management import MPITaskScheduler

    log = logging.getLogger("parsl.executors.high_throughput.process_worker_pool")
    give_back = getattr(MPITaskScheduler, "_return_nodes", None)
    if give_back is None:  # another Parsl: its pool runs as it is, lost nodes included
        log.warning("parsl-torch: this Parsl's MPITaskScheduler has no _return_nodes: lost nodes are not kept out")
        return
    start, take = MPITaskScheduler.__init__, MPITaskScheduler.put_task

    def __init__(self, *args, **kwargs):
        start(self, *args, **kwargs)
        held = min(spares, max(len(self.available_nodes) - 1, 0))
        nodes = [self.nodes_q.get() for _ in range(len(self.available_nodes))]
        self.spare_nodes = nodes[len(nodes) - held:]
        for node in nodes[:len(nodes) - held]:
            self.nodes_q.put(node)
        with self._free_node_counter.get_lock():
            self._free_node_counter.value -= held
        log.info("parsl-torch: spare node(s) held back: %s", self.spare_nodes)

    def return_nodes(self, nodes):
        lost = _lost(path)
        kept = [n for n in nodes if n.split(".")[0] not in lost]
        if len(kept) < len(nodes):
            released = [self.spare_nodes.pop() for _ in range(min(len(nodes) - len(kept), len(self.spare_nodes)))]
            log.warning("parsl-torch: not returning lost node(s) %s to the free pool; spare(s) released: %s",
                        sorted(set(nodes) - set(kept)), released)
            kept += released
        give_back(self, kept)

    def put_task(self, task_package):
        """A task that needs more nodes than the block has left starts on the nodes left if its
        ``min_nodes`` allows; else it goes on at once, given none, with the reason (its supervisor
        fails it saying so) instead of waiting in the backlog forever."""
        spec = task_package.get("context", {}).get("resource_spec", {})
        lost = _lost(path)
        left = len([n for n in self.available_nodes if n.split(".")[0] not in lost]) - len(self.spare_nodes)
        needed = int(spec.get("num_nodes") or 0)
        if needed <= left:
            return take(self, task_package)
        if 0 < int(spec.get(MIN_NODES_KEY) or needed + 1) <= left:
            log.warning("parsl-torch: task %s asks for %d node(s), the block has %d left (%s lost): it starts on "
                        "%d (min_nodes %s)", task_package["task_id"], needed, left, ", ".join(sorted(lost)), left,
                        spec[MIN_NODES_KEY])
            ranks_per_node = int(spec.get("ranks_per_node") or int(spec["num_ranks"]) // needed)
            spec.update(num_nodes=left, num_ranks=left * ranks_per_node)
            return take(self, task_package)
        spec["MPI_NODELIST"], spec[SHORT_KEY] = "", (
            f"the stage needs {needed} node(s) but its block has {left} left: "
            f"{', '.join(sorted(lost)) or 'none'} lost in this job (quarantined), "
            f"{len(self.spare_nodes)} spare(s) held back")
        self._map_tasks_to_nodes[task_package["task_id"]] = []
        self.pending_task_q.put(task_package)
        return None

    MPITaskScheduler.__init__ = __init__
    MPITaskScheduler._return_nodes = return_nodes
    MPITaskScheduler.put_task = put_task


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        sys.exit("usage: parsl-torch-pool [--spares N] [--path DIR ...] QUARANTINE -- PROCESS_WORKER_POOL_ARGS "
                 "(set by pt.workflow)")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="parsl-torch-pool")
    parser.add_argument("--spares", type=int, default=0, help="nodes per block held back for lost ones")
    parser.add_argument("--path", action="append", default=[], help="a folder the workers import from")
    parser.add_argument("quarantine", help="the workflow's file of lost nodes")
    opts = parser.parse_args(argv[:split])
    os.environ[settings.QUARANTINE.name] = opts.quarantine  # the stages' supervisors record lost nodes there
    if opts.path:  # for this process and the workers it starts (spawned: they read PYTHONPATH)
        sys.path[:0] = opts.path
        os.environ["PYTHONPATH"] = os.pathsep.join([*opts.path, *filter(None, [os.environ.get("PYTHONPATH")])])
    _keep_lost_nodes_out(opts.quarantine, opts.spares)
    sys.argv = ["process_worker_pool.py", *argv[split + 1:]]
    runpy.run_module("parsl.executors.high_throughput.process_worker_pool", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
