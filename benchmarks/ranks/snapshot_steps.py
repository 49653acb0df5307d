"""One rank of bench_snapshot: training steps of a Transformer with AdamW (DDP or FSDP2), its state kept in
node memory one way.

usage: snapshot_steps.py MODE STRATEGY DIM LAYERS STEPS   (MODE: plain | measured | every-step;
prints rank 0's JSON line: the median step time, with the snapshots' stall in it, and the interval)
"""

import json
import statistics
import sys
import time

import torch

import parsl_torch as pt

mode, strategy, dim, layers, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
pt.setup_torch(seed=0)
model = pt.wrap_model(pt.models.Transformer(vocab_size=256, dim=dim, n_heads=8, n_layers=layers, max_seq_len=64),
                      strategy=strategy)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)


def put_back(state):
    raise AssertionError("nothing is restored here")


kept = pt.Snapshots(lambda: {"model": model.state_dict(), "opt": opt.state_dict()}, put_back,
                    replicated=strategy == "ddp", every=1 if mode == "every-step" else None, enabled=mode != "plain")
times, taken = [], 0
for step in range(steps):
    t0 = time.perf_counter()
    loss = model(torch.randint(0, 256, (8, 64))).float().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if kept.due(step):
        kept.keep(step)
        taken += 1
    times.append(time.perf_counter() - t0)
kept.finish()
if pt.get_rank() == 0:
    warm = times[steps // 5:]  # (the first steps warm up)
    print(json.dumps({"step_s": statistics.median(warm), "mean_s": statistics.fmean(warm), "taken": taken,
                      "every": kept.every, "stall_s": kept.stall}))
pt.cleanup()
