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
import os
import runpy
import sys

from .. import parslext
from ..common import entrypoints, settings
from ..errors import ConfigError
from .leanparsl import lean_imports


def scheduler_class(path: str, spares: int, accelerators: tuple[str, ...], visibility: str) -> type:
    """The block's ``poolscheduler.PoolScheduler``: ``path``, the workflow's file of lost nodes; ``spares``,
    nodes held back; ``accelerators`` of each node and the ``visibility`` variable that narrows them."""
    from .poolscheduler import PoolScheduler

    return type("PoolScheduler", (PoolScheduler,), {"quarantine_path": path, "spares": spares,
                                                    "accelerators": tuple(accelerators), "visibility": visibility})


def _place_with_slots(path: str, spares: int, accelerators: tuple[str, ...], visibility: str) -> None:
    from parsl.executors.high_throughput import mpi_resource_management

    # the worker pool's module imports the class by name when it runs: this one is found there
    mpi_resource_management.MPITaskScheduler = scheduler_class(path, spares, accelerators, visibility)


#: Parsl's worker pool, run as this process's main module
POOL_MODULE = "parsl.executors.high_throughput.process_worker_pool"


def _fork_workers_from_a_preloaded_server() -> None:
    """Parsl's pool spawns its manager's server process and each worker: each a fresh Python that
    imports Parsl again (1.5 to 2 s of CPU, three times per local block, before the first stage can
    start). Python's forkserver imports it once, lean (``launch.pool_preload``), in a process of its
    own with no threads, and forks each of them from there (what Python 3.14 does by default)."""
    import multiprocessing

    import parsl.multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([entrypoints.POOL_PRELOAD])
    parsl.multiprocessing.SpawnContext = context  # the pool's module takes it by name when it runs


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
    with lean_imports():
        try:
            parslext.check(parslext.IN_THE_POOL)  # (the pool's Python may not be the workflow's)
        except ConfigError as exc:
            sys.exit(f"parsl-torch-pool: {exc}")
        _place_with_slots(opts.quarantine, opts.spares, tuple(filter(None, opts.accelerators.split(","))),
                          opts.visibility)
        _fork_workers_from_a_preloaded_server()
        sys.argv = ["process_worker_pool.py", *argv[split + 1:]]
        runpy.run_module(POOL_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
