"""Rank 0 prints the median seconds of a gloo ``init_process_group`` and of the barrier that
``setup_torch`` adds after it, over REPS groups made one after another in this process."""

import datetime
import os
import statistics
import sys
import time

import torch.distributed as dist

reps, base = int(sys.argv[1]), int(sys.argv[2])
rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
init, barrier = [], []
for i in range(reps):
    t0 = time.perf_counter()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{base + i}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    t1 = time.perf_counter()
    dist.barrier()
    t2 = time.perf_counter()
    dist.destroy_process_group()
    init.append(t1 - t0)
    barrier.append(t2 - t1)
if rank == 0:
    print(statistics.median(init), statistics.median(barrier))
