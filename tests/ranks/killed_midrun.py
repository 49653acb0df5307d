"""Syncs and flushes every 10 steps, then SIGKILLs itself at step 35 (one process).

usage: killed_midrun.py FINAL.h5
"""

import os
import signal
import sys

import parsl_torch as pt

h = pt.History("train", path=sys.argv[1], sync_every=10, flush_every=0)
for step in range(100):
    h.update({"loss": 1.0 / (step + 1)})
    if step == 35:
        os.kill(os.getpid(), signal.SIGKILL)
