"""What activation checkpointing (``wrap_model(activation_checkpointing=...)``, ``core.recompute``)
saves in memory and costs in step time, against the plain model measured in the same run: a
Transformer's forward and backward pass on CPU, each mode in a fresh process (its peak RSS is its
own), interleaved over repeats.

Printed per mode: the activations kept for the backward pass (bytes of the tensors autograd saved,
exact), the process's peak RSS, and the median step time, each as a ratio to the plain model's.

usage: python benchmarks/bench_recompute.py [--dim 256] [--layers 8] [--seq 512] [--batch 8]
       [--steps 6] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from common import bench_env

STEP = """
import json, resource, sys, time
import torch
import parsl_torch as pt
from parsl_torch.core.models import Transformer

mode, dim, layers, seq, batch, steps = sys.argv[1], *map(int, sys.argv[2:7])
torch.manual_seed(0)
model = pt.wrap_model(Transformer(vocab_size=1024, dim=dim, n_heads=max(1, dim // 64), n_layers=layers,
                                  max_seq_len=seq), strategy="none", activation_checkpointing=mode)
tokens = torch.randint(0, 1024, (batch, seq))
saved = [0]

def keep(t):
    saved[0] += t.numel() * t.element_size()
    return t

times = []
for i in range(steps):
    saved[0] = 0
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        loss = model(tokens).float().logsumexp(-1).mean()
    loss.backward()
    model.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
print(json.dumps({"saved": saved[0], "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "step_s": sorted(times[1:])[len(times[1:]) // 2]}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    modes = ("none", "selective", "full")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    shape = [str(v) for v in (args.dim, args.layers, args.seq, args.batch, args.steps)]
    for _ in range(args.reps):
        for mode in modes:  # (interleaved: a slow moment of the machine falls on every mode alike)
            out = subprocess.run([sys.executable, "-c", STEP, mode, *shape], capture_output=True, text=True,
                                 env=bench_env(), check=True, timeout=1800)
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("saved", "rss", "step_s")} for m, rs in runs.items()}
    base = med["none"]
    print(f"Transformer dim {args.dim}, {args.layers} layers, sequence {args.seq}, batch {args.batch}, CPU; "
          f"median of {args.reps} fresh processes x {args.steps - 1} steps")
    for mode in modes:
        m = med[mode]
        print(f"{mode:>9}: activations kept {m['saved'] / 2**20:8.1f} MiB ({m['saved'] / base['saved']:.2f}x), "
              f"peak RSS {m['rss'] / 2**20:7.0f} MiB ({m['rss'] / base['rss']:.2f}x), "
              f"step {m['step_s'] * 1e3:7.1f} ms ({m['step_s'] / base['step_s']:.2f}x)")
    print(json.dumps({m: {"saved_ratio": med[m]["saved"] / base["saved"], "rss_ratio": med[m]["rss"] / base["rss"],
                          "step_ratio": med[m]["step_s"] / base["step_s"]} for m in modes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
