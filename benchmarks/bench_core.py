"""Core overheads against plain torch, measured side by side in one run.

(a) launch to first completed all_reduce: setup_torch vs a hand-written
    init_process_group, under torchrun and under mpiexec (2 ranks, gloo).
    Under mpiexec the hand-written script needs MASTER_ADDR/PORT set by hand;
    setup_torch finds them with an mpi4py broadcast (MPI_Init, ~80 ms here),
    and "parsl_torch+env" shows it given the same variables as the baseline.
(b) training steps/s: wrap_model(strategy="ddp") vs DistributedDataParallel.

Variants alternate within each repetition so drift hits both alike; the
figure is the ratio of medians (parsl-torch / plain). Targets: (a) <= 1.0x,
(b) >= 0.98x.

usage: python benchmarks/bench_core.py [--reps 7] [--steps 200]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import BIN, bench_env

HERE = Path(__file__).parent / "ranks"


def launcher_argv(launcher: str, script: list[str]) -> tuple[list[str], dict[str, str]]:
    env = bench_env()
    if launcher == "torchrun":
        return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", *script], env
    return [str(BIN / "mpiexec"), "-n", "2", sys.executable, *script], env


def time_to_first_allreduce(launcher: str, mode: str) -> float:
    argv, env = launcher_argv(launcher, [str(HERE / "first_allreduce.py"), mode.split("+")[0]])
    if launcher == "mpiexec" and mode != "parsl_torch":
        # a hand-written script under mpiexec needs the rendezvous set by hand;
        # "parsl_torch+env" gets the same, which skips the mpi4py broadcast
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29555")
    t0 = time.time()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    done = [l for l in out.stdout.splitlines() if l.startswith("DONE")]
    if out.returncode or not done:
        raise SystemExit(f"{launcher}/{mode} failed:\n{out.stderr[-2000:]}")
    return float(done[0].split()[1]) - t0


def steps_per_s(mode: str, steps: int) -> float:
    argv, env = launcher_argv("mpiexec", [str(HERE / "ddp_steps.py"), mode, str(steps)])
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    line = [l for l in out.stdout.splitlines() if l.startswith("STEPS_PER_S")]
    if out.returncode or not line:
        raise SystemExit(f"ddp {mode} failed:\n{out.stderr[-2000:]}")
    return float(line[0].split()[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()

    print("(a) launch -> first all_reduce, 2 ranks, gloo (median of %d)" % args.reps)
    for launcher in ("torchrun", "mpiexec"):
        modes = ["parsl_torch", "plain"] + (["parsl_torch+env"] if launcher == "mpiexec" else [])
        times: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(args.reps):
            for mode in modes:
                times[mode].append(time_to_first_allreduce(launcher, mode))
        plain = statistics.median(times["plain"])
        for mode in modes:
            if mode != "plain":
                ours = statistics.median(times[mode])
                print(f"  {launcher:9s} {mode:16s} {ours:6.3f}s  plain {plain:6.3f}s  "
                      f"ratio {ours / plain:.3f}x (target <= 1.0x)")

    print("(b) DDP training steps/s, 2 ranks under mpiexec (median of %d)" % max(3, args.reps // 2))
    rates: dict[str, list[float]] = {"parsl_torch": [], "plain": []}
    for _ in range(max(3, args.reps // 2)):
        for mode in rates:
            rates[mode].append(steps_per_s(mode, args.steps))
    ours, plain = (statistics.median(rates[m]) for m in ("parsl_torch", "plain"))
    print(f"  wrap_model {ours:8.2f}/s  hand-written DDP {plain:8.2f}/s  ratio {ours / plain:.3f}x (target >= 0.98x)")


if __name__ == "__main__":
    main()
