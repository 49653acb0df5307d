"""The cost of a continuation: from the moment a stage stops for its block's end to its first
step in the next block, through a workflow on the local site (30 s blocks: Parsl drains the old
block, starts a new one, the stage is submitted again and resumes), against the same stop and
restart done by hand with bare mpiexec (the plain baseline: the process restart alone), in one run.

usage: python benchmarks/bench_continuation.py [--steps 4000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import BIN, bench_env

HERE = Path(__file__).resolve().parent
TICKING = HERE / "ranks" / "ticking.py"


def gaps(times: Path) -> dict[str, float]:
    """Seconds from the first run's stop (and its deadline) to the next run's first step."""
    runs = [json.loads(line) for line in times.read_text().splitlines()]
    first, second = runs[0], runs[1]
    return {"stop_to_training": second["first_step"] - first["stopped"],
            "deadline_to_training": second["first_step"] - first["deadline"],
            "deadline_to_stop": first["stopped"] - first["deadline"], "runs": len(runs)}


def bare(tmp: Path, steps: int) -> dict[str, float]:
    mpiexec = str(BIN / "mpiexec")
    argv = [mpiexec, "-n", "2", sys.executable, str(TICKING), str(tmp / "bare.pt"), str(steps), str(tmp / "bare.jsonl")]
    first = subprocess.run(argv, env=bench_env(PARSL_TORCH_DEADLINE=f"{time.time() + 10:.3f}"), capture_output=True,
                           text=True, timeout=600)
    if first.returncode != 99:  # stopped at its deadline: "to be continued"
        raise SystemExit(f"bare run: exit {first.returncode}\n{first.stderr[-3000:]}")
    second = subprocess.run(argv, env=bench_env(), capture_output=True, text=True, timeout=600)
    if second.returncode:
        raise SystemExit(f"bare rerun failed:\n{second.stderr[-3000:]}")
    return gaps(tmp / "bare.jsonl")


WORKFLOW = """
import sys
import parsl_torch as pt
script, checkpoint, steps, times, run_dir = sys.argv[1:]
stage = pt.script_app(script, args=[checkpoint, steps, times])
with pt.workflow(site="local", run_dir=run_dir, walltime="00:00:30"):
    stage().result()
"""


def workflow(tmp: Path, steps: int) -> dict[str, float]:
    (tmp / "wf.py").write_text(WORKFLOW)
    out = subprocess.run([sys.executable, str(tmp / "wf.py"), str(TICKING), str(tmp / "wf.pt"), str(steps),
                          str(tmp / "wf.jsonl"), str(tmp / "run")], env=bench_env(), capture_output=True, text=True,
                         timeout=900)
    if out.returncode:
        raise SystemExit(f"workflow failed:\n{out.stderr[-3000:]}")
    return gaps(tmp / "wf.jsonl")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4000, help="enough for two 30 s blocks")
    args = p.parse_args()
    os.environ.pop("PARSL_TORCH_DEADLINE", None)
    with tempfile.TemporaryDirectory() as tmp:
        plain = bare(Path(tmp), args.steps)
        cont = workflow(Path(tmp), args.steps)
    print("continuation: a 2-rank stage stops at its deadline and trains again in the next block (local site):")
    print(f"  deadline -> stopped (agreement + save)   bare {plain['deadline_to_stop']:6.2f} s   "
          f"workflow {cont['deadline_to_stop']:6.2f} s")
    print(f"  stopped -> training again              bare {plain['stop_to_training']:6.2f} s   "
          f"workflow {cont['stop_to_training']:6.2f} s   ratio {cont['stop_to_training'] / plain['stop_to_training']:.2f}")
    print(f"  deadline -> training again             bare {plain['deadline_to_training']:6.2f} s   "
          f"workflow {cont['deadline_to_training']:6.2f} s   ratio "
          f"{cont['deadline_to_training'] / plain['deadline_to_training']:.2f}   ({cont['runs']} blocks)")


if __name__ == "__main__":
    main()
