"""Every rank on one core, the last one at the idle priority (it runs only when nothing else
wants the core); the others leave as soon as ``setup_torch`` returns, with no collective.
A rank that could leave before the last one had joined took the store and its connections
with it, and the last rank failed at start."""

import os

import parsl_torch as pt

rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
os.sched_setaffinity(0, {0})
if rank == size - 1:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
pt.setup_torch()
if rank != size - 1:
    os._exit(0)
pt.cleanup()
