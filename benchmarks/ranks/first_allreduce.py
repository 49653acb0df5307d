"""One rank of the start-up benchmark: init the process group, do one
all_reduce; rank 0 prints the wall-clock time at which it completed.

usage: first_allreduce.py parsl_torch|plain
"""

import os
import sys
import time

import torch
import torch.distributed as dist

if sys.argv[1] == "parsl_torch":
    import parsl_torch as pt

    pt.setup_torch()
else:  # what a user writes by hand: env:// with the launcher's variables
    rank = int(os.environ.get("RANK", os.environ.get("PMI_RANK", 0)))
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("PMI_SIZE", 1)))
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 0:
    print(f"DONE {time.time():.6f}", flush=True)
dist.destroy_process_group()
