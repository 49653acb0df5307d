"""One rank of the DDP throughput benchmark: the same model and loop, wrapped
by wrap_model or by a hand-written DistributedDataParallel.

usage: ddp_steps.py parsl_torch|plain STEPS
"""

import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import parsl_torch as pt
from parsl_torch.core.models import Transformer

mode, steps = sys.argv[1], int(sys.argv[2])
rank = pt.setup_torch(seed=0)
model = Transformer(vocab_size=128, dim=128, n_heads=4, n_layers=2, max_seq_len=64)
if mode == "parsl_torch":
    model = pt.wrap_model(model, strategy="ddp")
else:
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
tokens = torch.randint(0, 128, (8, 64), generator=torch.Generator().manual_seed(rank))


def step():
    loss = F.cross_entropy(model(tokens[:, :-1]).reshape(-1, 128), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


for _ in range(5):  # warm-up
    step()
dist.barrier()
t0 = time.perf_counter()
for _ in range(steps):
    step()
dist.barrier()
if rank == 0:
    print(f"STEPS_PER_S {steps / (time.perf_counter() - t0):.3f}", flush=True)
pt.cleanup()
