"""An unmodified torchrun-style script: env:// rendezvous, no parsl_torch."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} local {os.environ['LOCAL_RANK']} "
      f"sum {t.item():g}", flush=True)
dist.destroy_process_group()
