"""Stages that start every time: STAGES short stages (2 and 4 ranks alternating, two at a time on
the local site, every 7th one killing its own ranks so that the next starts right after it) must
all start (tests/workflows/start_stress.py; the test suite runs 10 of them). Then the price of the
barrier that ``setup_torch`` adds after ``init_process_group`` so that no rank can leave before
every rank has joined: a 2-rank gloo init with and without it, measured in the same ranks.

usage: python benchmarks/bench_start.py [--stages 200] [--reps 20]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import BIN, REPO, bench_env

from parsl_torch.core.topology import free_port


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stages", type=int, default=200)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    env = bench_env(PARSL_TORCH_SCHEDULER="local")
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, str(REPO / "tests" / "workflows" / "start_stress.py"),
                              str(Path(tmp) / "run"), str(args.stages)], env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"start_stress.py failed:\n{out.stderr[-3000:]}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    for failure in summary["failed"]:
        print("FAILED", failure)
    started = summary["stages"] - summary["killed"]
    print(f"{summary['stages']} stages ({summary['killed']} killed their own ranks): "
          f"{started - len(summary['failed'])} of {started} others started and returned, "
          f"{summary['seconds'] / summary['stages']:.2f} s per stage, two at a time")
    base = free_port()
    cost = subprocess.run([str(BIN / "mpiexec"), "-n", "2", sys.executable,
                           str(Path(__file__).parent / "ranks" / "init_cost.py"), str(args.reps), str(base)],
                          env=env, capture_output=True, text=True, check=True)
    init, barrier = map(float, cost.stdout.split())
    print(f"2-rank gloo init {init * 1e3:.1f} ms, with setup_torch's barrier {(init + barrier) * 1e3:.1f} ms "
          f"-> {(init + barrier) / init:.3f}x (medians of {args.reps})")
    if summary["failed"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
