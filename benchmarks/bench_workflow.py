"""A train stage through the workflow (Parsl, local site) against the same
stage module under bare ``mpiexec -n 2``, in the same run (target <= 1.05x
for a ~60 s stage), the fixed overhead, and the time to rerun the finished
workflow (every stage skipped).

usage: python benchmarks/bench_workflow.py [--steps 3000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import yaml
from common import BIN, bench_env, timed

WORKFLOW = """
import sys, parsl_torch as pt
from parsl_torch.stages.train import train
with pt.workflow(site="local", run_dir=sys.argv[2]):
    print(train(sys.argv[1], ranks_per_node=2).result()["final_loss"])
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    env = bench_env(PARSL_TORCH_SCHEDULER="local")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        config = tmp / "train.yaml"
        config.write_text(yaml.safe_dump({"steps": args.steps, "checkpoint_every": 500, "log_every": 500}))
        script = tmp / "workflow.py"
        script.write_text(WORKFLOW)
        bares, flows = [], []
        for rep in range(args.reps):  # alternate, so drift on a shared machine hits both alike
            bares.append(timed([str(BIN / "mpiexec"), "-n", "2", sys.executable, "-m", "parsl_torch.stages.train",
                                "--config", str(config), "--history", str(tmp / f"bare{rep}.h5"),
                                "--checkpoint", str(tmp / f"bare{rep}.pt")], env))
            flows.append(timed([sys.executable, str(script), str(config), str(tmp / f"run{rep}")], env))
        rerun = timed([sys.executable, str(script), str(config), str(tmp / "run0")], env)
        bare, flow = statistics.median(bares), statistics.median(flows)
    print(f"train stage, {args.steps} steps on 2 ranks (median of {args.reps}): workflow {flow:.1f} s, bare mpiexec {bare:.1f} s -> "
          f"{flow / bare:.3f}x, fixed overhead {flow - bare:+.1f} s (target <= 1.05x)")
    print(f"rerun of the finished workflow (stage skipped): {rerun:.1f} s")


if __name__ == "__main__":
    main()
