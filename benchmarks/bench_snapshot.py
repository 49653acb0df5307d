"""The cost of keeping the train state in node memory (``pt.Snapshots``, ``core.snapshot``) as a ratio of
the step time: the same training steps (a Transformer with AdamW, 2 ranks) without snapshots, with the
interval measured (the default: at most 2 % of the step time) and with one every step, in the same run.

usage: python benchmarks/bench_snapshot.py [--dim 512] [--layers 4] [--steps 100] [--strategy ddp|fsdp]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import bench_env, rank_json

HERE = Path(__file__).resolve().parent


def run(mode: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as stage_dir:  # (a computation of a stage: its state is kept)
        env = bench_env(PARSL_TORCH_CALL_ID=f"bench-{mode}", PARSL_TORCH_STAGE_DIR=stage_dir)
        return rank_json(HERE / "ranks" / "snapshot_steps.py", 2, mode, args.strategy, str(args.dim),
                         str(args.layers), str(args.steps), env=env, cwd=stage_dir)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--strategy", default="ddp", choices=("ddp", "fsdp"))
    args = p.parse_args()
    plain = run("plain", args)
    print(f"{args.strategy}, 2 ranks, dim {args.dim}, {args.layers} layers: plain step {plain['mean_s'] * 1e3:.1f} ms "
          f"(mean), {plain['step_s'] * 1e3:.1f} ms (median)")
    for mode in ("measured", "every-step"):
        row = run(mode, args)
        print(f"  {mode:10s}: mean step {row['mean_s'] * 1e3:.1f} ms = {row['mean_s'] / plain['mean_s']:.3f}x the "
              f"plain loop; {row['taken']} snapshots, the last interval {row['every']} step(s), its stall "
              f"{row['stall_s'] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
