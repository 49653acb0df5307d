"""Every rank on one core, the last one starved while it joins (stopped for 19 ms of every 20 by a
child that sleeps: a busy peer would burn a core for it); the others leave as soon as ``setup_torch``
returns, with no collective. A rank that could leave before the last one had joined took the store
and its connections with it, and the last rank failed at start ("Gloo connectFullMesh failed ...
Connection closed by peer": about half the launches without the barrier that prevents it)."""

import os
import select
import signal
import time

import torch.distributed  # noqa: F401 - imported at full speed: joining is what is slowed

import parsl_torch as pt

STOPPED, RUNNING = 0.019, 0.001


def slow_down() -> int:
    """Start the child that stops this process most of the time; closing what it returns ends it."""
    pid = os.getpid()
    done, keep = os.pipe()
    if os.fork():
        os.close(done)
        return keep
    os.close(keep)
    try:
        while not select.select([done], [], [], 0)[0]:  # (the pipe closed: the parent is done or gone)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(STOPPED)
            os.kill(pid, signal.SIGCONT)
            time.sleep(RUNNING)
    finally:
        os._exit(0)


rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
os.sched_setaffinity(0, {0})
throttle = slow_down() if rank == size - 1 else None
pt.setup_torch()
if rank != size - 1:
    os._exit(0)
os.close(throttle)
pt.cleanup()
