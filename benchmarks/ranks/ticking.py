"""A small training loop that stops at its deadline: the continuation benchmark's stage, run by
bare mpiexec and by a workflow alike. Rank 0 appends one JSON line per run to TIMES: the deadline,
when the loop stopped for it, and when its first step (after a resume) finished.

usage: ticking.py CHECKPOINT TOTAL_STEPS TIMES
"""

import json
import os
import sys
import time

import torch

import parsl_torch as pt
from parsl_torch.core.deadline import deadline

checkpoint, total, times = sys.argv[1], int(sys.argv[2]), sys.argv[3]
pt.setup_torch()
model = pt.wrap_model(torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)),
                      strategy="ddp")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
start = 0
if os.path.exists(checkpoint):
    state = torch.load(checkpoint)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    start = state["step"]
record = {"deadline": deadline(), "resumed_from": start, "first_step": None, "stopped": None}


def write_record() -> None:
    if pt.get_rank() == 0:
        with open(times, "a") as f:
            f.write(json.dumps(record) + "\n")


for step in range(start, total):
    x = torch.randn(64, 256)
    loss = (model(x) - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    record["first_step"] = record["first_step"] or time.time()
    if pt.should_checkpoint():
        if pt.get_rank() == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step + 1},
                       checkpoint + ".tmp")
            os.replace(checkpoint + ".tmp", checkpoint)
        pt.barrier()
        record["stopped"] = time.time()
        write_record()
        pt.to_be_continued(step + 1)
write_record()
pt.cleanup()
