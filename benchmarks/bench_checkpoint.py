"""Checkpoint save and load of the train stage's model with its Adam state: sharded (DCP, every
rank writes its shards) against the full-state file (gathered to rank 0), in the same run, on
2 ranks: time and rank 0's peak memory.

usage: python benchmarks/bench_checkpoint.py [--dim 768] [--layers 8] [--ranks 2]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import rank_json

HERE = Path(__file__).resolve().parent


def run(mode: str, ranks: int, dim: int, layers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        return rank_json(HERE / "ranks" / "checkpoint_io.py", ranks, mode, tmp, str(dim), str(layers))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args()
    full = run("full", args.ranks, args.dim, args.layers)
    sharded = run("sharded", args.ranks, args.dim, args.layers)
    print(f"checkpoint of a {full['params'] / 1e6:.0f} M-parameter model + Adam state, {args.ranks} ranks (FSDP2):")
    for key, what in (("save_s", "save (s)"), ("load_s", "load (s)"), ("peak_rise_mib", "rank 0 peak rise (MiB)")):
        ratio = sharded[key] / full[key] if full[key] else float("nan")
        print(f"  {what:<24} full-state file {full[key]:9.2f}   sharded (DCP) {sharded[key]:9.2f}   "
              f"ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
