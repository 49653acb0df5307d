"""Throughput per parallel layout (``wrap_model(layout=...)``) against a plain torch DDP loop
measured in the same run, on 4 ranks over gloo: the same Transformer, global batch and steps.

Printed per layout: tokens/s over all ranks (median of the repeats, each the mean over the timed
steps) and its ratio to the plain loop's, and for pipelines the bubble the schedule implies,
``(stages - 1) / (microbatches + stages - 1)``. On CPUs every rank competes for the same cores, so
the figures say what a layout's communication and schedule cost, not what a GPU would reach.

usage: python benchmarks/bench_layouts.py [--ranks 4] [--steps 8] [--reps 2] [--dim 128] [--layers 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from common import BIN, bench_env

WORKER = """
import json, sys, time
import torch, torch.distributed as dist, torch.nn.functional as F
import parsl_torch as pt
from parsl_torch.core.models import Transformer

spec, dim, layers, steps = json.loads(sys.argv[1]), *map(int, sys.argv[2:5])
VOCAB, SEQ, BATCH = 512, 128, 16
rank = pt.setup_torch(seed=0)
world = pt.get_world_size()
torch.manual_seed(0)
net = Transformer(vocab_size=VOCAB, dim=dim, n_heads=max(1, dim // 32), n_layers=layers, max_seq_len=SEQ)
loss_fn = lambda out, tgt: F.cross_entropy(out.reshape(-1, VOCAB).float(), tgt.reshape(-1))
if spec == "plain":  # a hand-written DDP loop: no parsl-torch between the model and torch
    model, dp, dp_size = torch.nn.parallel.DistributedDataParallel(net), rank, world
else:
    layout = pt.Layout(**spec)
    model = pt.wrap_model(net, layout=layout, loss_fn=loss_fn if layout.pp > 1 else None)
    coords = layout.coords(rank, world)
    dp, dp_size = coords.dp, coords.dp_size
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
times = []
for step in range(steps + 2):
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(step))
    x, y = (t.chunk(dp_size)[dp] for t in (tokens[:, :-1], tokens[:, 1:]))
    dist.barrier()
    t0 = time.perf_counter()
    if hasattr(model, "step"):
        loss = model.step(x, y)
    else:
        loss = loss_fn(model(x), y)
        loss.backward()
    opt.step()
    opt.zero_grad()
    loss.item()
    times.append(time.perf_counter() - t0)
if rank == 0:
    print(json.dumps({"tokens_per_s": BATCH * SEQ / (sum(times[2:]) / steps)}))
pt.cleanup()
"""

LAYOUTS = {
    "plain DDP loop": "plain",
    "ddp": {"dp_replicate": 4, "dp_shard": 1},
    "fsdp": {"dp_shard": 4},
    "fsdp 2 x tp 2": {"tp": 2},
    "pp 2 x fsdp 2, 1f1b, 2 microbatches": {"pp": 2, "pp_microbatches": 2},
    "pp 2 x fsdp 2, 1f1b, 8 microbatches": {"pp": 2, "pp_microbatches": 8},
    "pp 2 x fsdp 2, interleaved, 8 microbatches": {"pp": 2, "pp_schedule": "interleaved-1f1b", "pp_microbatches": 8},
    "pp 4, gpipe, 4 microbatches": {"pp": 4, "pp_schedule": "gpipe", "pp_microbatches": 4},
}


def bubble(spec: dict | str) -> float | None:
    """The fraction of a step a pipeline leaves each rank idle: (p - 1) / (v m + p - 1) for p ranks
    of v stages each and m microbatches (Narayanan et al. 2021)."""
    if spec == "plain" or spec.get("pp", 1) == 1:
        return None
    p, v = spec["pp"], 2 if spec.get("pp_schedule") == "interleaved-1f1b" else 1
    m = spec.get("pp_microbatches") or p * v
    return (p - 1) / (v * m + p - 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=8)
    args = p.parse_args()
    runs: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    for _ in range(args.reps):
        for name, spec in LAYOUTS.items():  # (interleaved: a slow moment falls on every layout alike)
            out = subprocess.run([str(BIN / "mpiexec"), "-n", str(args.ranks), sys.executable, "-c", WORKER,
                                  json.dumps(spec), str(args.dim), str(args.layers), str(args.steps)],
                                 capture_output=True, text=True, env=bench_env(), timeout=1800)
            if out.returncode:
                raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"])
    med = {name: statistics.median(v) for name, v in runs.items()}
    base = med["plain DDP loop"]
    print(f"Transformer dim {args.dim}, {args.layers} layers, sequence 128, global batch 16, {args.ranks} ranks "
          f"(gloo, CPU); median of {args.reps} runs x {args.steps} steps")
    for name, spec in LAYOUTS.items():
        b = bubble(spec)
        print(f"{name:>44}: {med[name]:8.0f} tokens/s ({med[name] / base:.2f}x the plain loop)"
              + (f", bubble {b:.0%}" if b is not None else ""))
    print(json.dumps({name: med[name] / base for name in LAYOUTS}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
