"""Warm ranks (``pt.workflow(warm=True)``) against cold stages, in the same run, on the local site: a
chain of 10 dependent short 2-rank stages (an all_reduce and a few milliseconds of work each) after a
first one that starts the ranks. The figure is the cost per stage over the stage's own work, warm
and cold, and their ratio (goal: warm <= 0.2 s, <= 0.1x of cold).

usage: python benchmarks/bench_warm.py [--stages 10] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import bench_env

WORKFLOW = """
import json, sys, time, parsl_torch as pt

@pt.distributed_app(ranks_per_node=2)
def step(i, previous=None):
    import torch, torch.distributed as dist
    pt.setup_torch()
    t0 = time.perf_counter()
    x = torch.ones(64); dist.all_reduce(x)
    time.sleep(0.005)  # the stage's own work
    return time.perf_counter() - t0

with pt.workflow(site="local", run_dir=sys.argv[1], warm=sys.argv[2] == "warm"):
    step(-1, stage="first").result()  # starts the warm ranks (cold: one stage like the others)
    t0, previous, work = time.perf_counter(), None, 0.0
    for i in range(int(sys.argv[3])):
        previous = step(i, previous, stage=f"s{i}")
        work += previous.result()
    print(json.dumps({"per_stage": (time.perf_counter() - t0) / int(sys.argv[3]),
                      "work": work / int(sys.argv[3])}))
"""


def one(tmp: Path, mode: str, stages: int, rep: int) -> float:
    out = subprocess.run([sys.executable, str(tmp / "wf.py"), str(tmp / f"{mode}{rep}"), mode, str(stages)],
                         env=bench_env(PARSL_TORCH_SCHEDULER="local"), capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    return figures["per_stage"] - figures["work"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stages", type=int, default=10)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "wf.py").write_text(WORKFLOW)
        cold = statistics.median(one(tmp, "cold", args.stages, r) for r in range(args.reps))
        warm = statistics.median(one(tmp, "warm", args.stages, r) for r in range(args.reps))
    print(f"a chain of {args.stages} dependent 2-rank stages after a first one (local site), seconds per stage "
          f"over its own work, median of {args.reps}:\n| cold | warm | warm / cold |\n|---|---|---|\n"
          f"| {cold:.3f} | {warm:.3f} | {warm / cold:.3f}x |")


if __name__ == "__main__":
    main()
