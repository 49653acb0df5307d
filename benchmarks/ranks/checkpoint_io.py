"""One rank of bench_checkpoint: an FSDP2 model with Adam state, saved and loaded one way.

usage: checkpoint_io.py MODE DIR DIM LAYERS   (MODE: full | sharded; prints rank 0's JSON line)
"""

import json
import resource
import sys
import time
from pathlib import Path

import torch

import parsl_torch as pt
from parsl_torch.stages import checkpoint

mode, where, dim, layers = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
pt.setup_torch(seed=0)
model = pt.wrap_model(pt.models.Transformer(vocab_size=256, dim=dim, n_heads=8, n_layers=layers, max_seq_len=32),
                      strategy="fsdp")
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
model(torch.randint(0, 256, (2, 32))).float().sum().backward()
opt.step()  # Adam's two moments exist: the state a resume needs
params = sum(p.numel() for p in model.parameters())  # DTensors: numel is the global size
pt.barrier()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
checkpoint.save(where / "ck", model, opt, 1, {}, None, "fsdp" if mode == "sharded" else "ddp")
save_s = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
checkpoint.restore(checkpoint.read(where / "ck"), model, opt)
pt.barrier()
load_s = time.perf_counter() - t0
if pt.get_rank() == 0:
    print(json.dumps({"params": params, "save_s": save_s,
                      "load_s": load_s, "peak_rise_mib": (peak - base) / 1024,
                      "peak_mib": peak / 1024}), flush=True)
pt.cleanup()
pt.exit_process(0)
