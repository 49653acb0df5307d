"""One rank of bench_checkpoint: an FSDP2 model with Adam state, saved and loaded one way.

usage: checkpoint_io.py MODE DIR DIM LAYERS   (MODE: full | sharded; prints rank 0's JSON line)
"""

import json
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


def memory_kib(field: str) -> int:
    """VmRSS (now) or VmHWM (the peak since the last reset) of this process, in KiB."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def save_full_state() -> None:
    """The alternative to DCP: the whole model and Adam state gathered to rank 0, one file (``checkpoint.save``
    shards every model whose parameters are DTensors, so it is written here as it would be)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_sd, optim_sd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if pt.get_rank() == 0:
        torch.save({"format": checkpoint.FORMAT, "step": 1, "model_config": {}, "call": None, "strategy": "ddp",
                    "world_size": pt.get_world_size(), "loss": None, "stopped": False, "model": model_sd,
                    "optimizer": optim_sd}, where / "ck")
    pt.barrier()


pt.barrier()
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) from here: the save's own
base = memory_kib("VmRSS")
t0 = time.perf_counter()
if mode == "sharded":
    checkpoint.save(where / "ck", model, opt, 1, {}, None, "fsdp")
else:
    save_full_state()
save_s = time.perf_counter() - t0
peak = memory_kib("VmHWM")
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
