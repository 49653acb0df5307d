"""Runs on every rank: records per-rank metrics with known cross-rank
statistics (rank r logs loss = step + r, so mean/min/max/std are exact), with
a metric only rank 1 records, several syncs and a remainder at finalize.

usage: history_suite.py OUT.h5 STEPS SYNC_EVERY
"""

import sys

import parsl_torch as pt

out, steps, sync_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rank = pt.setup_torch()
h = pt.History("train", sync_every=sync_every, units={"loss": "nats"},
               descriptions={"loss": "training loss"}, config={"lr": 0.1, "wandb_api_key": "hidden"})
for step in range(steps):
    metrics = {"loss": float(step + rank), "rank": rank}
    if rank == 1:
        metrics["only1"] = 2.0 * step
    h.update(metrics)
path = h.finalize(out)
print(f"rank {rank} finalized {path}", flush=True)
pt.cleanup()
pt.exit_process(0)  # torch can abort in exit-time destructors after a process group (README)
