"""Syncs and flushes every 10 steps, then SIGKILLs itself at step 35 (one process). With READ_EVERY,
each loss is a tensor, read every READ_EVERY steps (History(read_every=)).

usage: killed_midrun.py FINAL.h5 [READ_EVERY]
"""

import os
import signal
import sys

import parsl_torch as pt

read_every = int(sys.argv[2]) if len(sys.argv) > 2 else 1
if read_every > 1:
    import torch
h = pt.History("train", path=sys.argv[1], sync_every=10, flush_every=0, read_every=read_every)
for step in range(100):
    loss = 1.0 / (step + 1)
    h.update({"loss": torch.tensor(loss, dtype=torch.float64) if read_every > 1 else loss})
    if step == 35:
        os.kill(os.getpid(), signal.SIGKILL)
