"""Wall time of a short 2-rank job through ``parsl-torch launch`` against bare
``mpiexec -n 2 python ...``, alternating within each repetition (target
<= 1.03x at a ~20 s job). The job sleeps a fixed time after setting up, so
what differs is the launcher: the CLI's start-up, the rank shims, the failure
listener.

usage: python benchmarks/bench_launch.py [--seconds 20] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from common import BIN, bench_env, timed

JOB = str(Path(__file__).parent / "ranks" / "fixed_job.py")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    job = [sys.executable, JOB, str(args.seconds)]
    env = bench_env(PARSL_TORCH_SCHEDULER="local")
    runs: dict[str, list[float]] = {"launch": [], "mpiexec": []}
    for _ in range(args.reps):
        runs["launch"].append(timed([str(BIN / "parsl-torch"), "launch", "-n", "2", "--", *job], env))
        runs["mpiexec"].append(timed([str(BIN / "mpiexec"), "-n", "2", *job], env))
    ours, bare = statistics.median(runs["launch"]), statistics.median(runs["mpiexec"])
    print(f"2-rank {args.seconds:g} s job: parsl-torch launch {ours:.2f} s, bare mpiexec {bare:.2f} s -> "
          f"{ours / bare:.3f}x, +{ours - bare:.2f} s (target <= 1.03x)")


if __name__ == "__main__":
    main()
