"""``parsl-torch-pool QUARANTINE -- ARGS``: Parsl's worker pool (its
``process_worker_pool.py ARGS``), except that a node the block lost is not handed out again.

Parsl's MPI task scheduler puts a task's nodes back in the block's free pool when the task
ends, without a health check (node failures inside a block are out of Parsl's scope: its
issue #529): a stage placed on a lost node after it hangs, and the block is crippled without
a word. Here a task's nodes go back only if the stage's supervisor did not record them lost
in ``QUARANTINE`` (``launch.quarantine``); the block goes on with the nodes left, and a task
that needs more nodes than are left fails at once, saying so (it would wait forever).
"""

from __future__ import annotations

import logging
import os
import runpy
import sys

from ..common import settings
from . import quarantine


#: a key of a task's resource specification, which Parsl's worker exports as PARSL_<KEY>
SHORT_KEY = settings.NODES_SHORT.name.removeprefix("PARSL_").lower()


def _keep_lost_nodes_out(path: str) -> None:
    from parsl.executors.high_throughput.mpi_resource_management import MPITaskScheduler

    log = logging.getLogger("parsl.executors.high_throughput.process_worker_pool")
    give_back = getattr(MPITaskScheduler, "_return_nodes", None)
    if give_back is None:  # another Parsl: its pool runs as it is, lost nodes included
        log.warning("parsl-torch: this Parsl's MPITaskScheduler has no _return_nodes: lost nodes are not kept out")
        return

    def return_nodes(self, nodes):
        lost = {n.split(".")[0] for n in quarantine.lost_nodes(path, quarantine.job_of())}
        kept = [n for n in nodes if n.split(".")[0] not in lost]  # a node file may name hosts in full
        if len(kept) < len(nodes):
            log.warning("parsl-torch: not returning lost node(s) %s to the free pool", sorted(set(nodes) - set(kept)))
        give_back(self, kept)

    take = MPITaskScheduler.put_task

    def put_task(self, task_package):
        """A task that needs more nodes than the block has left goes on at once, given none, with the
        reason (its supervisor fails it saying so) instead of waiting in the backlog forever."""
        spec = task_package.get("context", {}).get("resource_spec", {})
        lost = {n.split(".")[0] for n in quarantine.lost_nodes(path, quarantine.job_of())}
        healthy = [n for n in self.available_nodes if n.split(".")[0] not in lost]
        needed = spec.get("num_nodes") or 0
        if needed <= len(healthy):
            return take(self, task_package)
        spec["MPI_NODELIST"], spec[SHORT_KEY] = "", (
            f"the stage needs {needed} node(s) but its block has {len(healthy)} left: "
            f"{', '.join(sorted(lost))} lost in this job (quarantined)")
        self._map_tasks_to_nodes[task_package["task_id"]] = []
        self.pending_task_q.put(task_package)
        return None

    MPITaskScheduler._return_nodes = return_nodes
    MPITaskScheduler.put_task = put_task


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[1] != "--":
        sys.exit("usage: parsl-torch-pool QUARANTINE -- PROCESS_WORKER_POOL_ARGS (set by pt.workflow)")
    os.environ[settings.QUARANTINE.name] = argv[0]  # the stages' supervisors record lost nodes there
    _keep_lost_nodes_out(argv[0])
    sys.argv = ["process_worker_pool.py", *argv[2:]]
    runpy.run_module("parsl.executors.high_throughput.process_worker_pool", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
