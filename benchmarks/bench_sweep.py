"""A sweep as a grid and with ASHA, side by side in one run (``pt.sweep``, docs/sweeps.md):

1. the same space (36 trials of the built-in Transformer: 9 learning rates, poor at both ends, times 4
   widths) trained to the same budget as a grid (``scheduler="none"``) and with ``asha``, one rank
   each, two at a time (the local site's slots), in one workflow; every trial that finishes is
   evaluated. Printed: the rank-steps each used (asha's against the grid's; goal <= 1/3), the best
   evaluation loss each found (asha's within 2 % of the grid's), and the wall times and their ratio;
2. what the decisions cost the workflow process at 1,000 simulated trials: each judged at 4 rungs, the
   record written after each look, and one look at 1,000 trials that wait for a slot.

usage: python benchmarks/bench_sweep.py [--steps 81] [--min-steps 3] [--dims 16,32,48,64] [--decisions-only]
(``--dims 16,32,48``: 27 trials; ``--dims 16,24,32,40,48,56,64``: 63)
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import bench_env

WORKFLOW = """
import json, sys, time
import parsl_torch as pt
from parsl_torch.stages.evaluate import evaluate

steps, min_steps, dims = int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
model = {"kind": "transformer", "vocab_size": 64, "dim": 32, "n_heads": 2, "n_layers": 1, "seq_len": 32}
base = {"model": model, "data": {"batch_size": 16}, "checkpoint_every": 1000, "log_every": 1000}
space = {"lr": [1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1], "model.dim": dims}
out = {}
with pt.workflow(site="local", run_dir=sys.argv[1]):
    for scheduler in ("none", "asha"):
        t0 = time.perf_counter()
        trials = pt.sweep(space, base=base, steps=steps, min_steps=min_steps, eta=3, scheduler=scheduler,
                          name=scheduler, ranks_per_node=1)
        evals = {t.name: evaluate({"model": t.config["model"], "batches": 8}, inputs=[t.result["checkpoint"]],
                                  stage=f"eval-{t.name}", ranks_per_node=1)
                 for t in trials if t.state == "finished"}
        losses = {name: e.result()["eval_loss"] for name, e in evals.items()}
        out[scheduler] = {"wall": time.perf_counter() - t0, "rank_steps": sum(t.step for t in trials),
                          "best": min(losses.values()), "finished": len(losses), "trials": len(trials),
                          "best_lr": min(trials, key=lambda t: losses.get(t.name, 1e9)).config["lr"]}
print("RESULT " + json.dumps(out))
"""


def decisions_cost(trials: int = 1000, rungs: int = 4) -> dict[str, float]:
    """The workflow's side of a sweep of ``trials`` simulated trials: each judged and written to the
    journal at each rung it reaches, and a look at every trial that waits for a slot."""
    import logging

    from parsl_torch.apps.sweeps.asha import Asha
    from parsl_torch.apps.sweeps.journal import SweepRecord
    from parsl_torch.apps.sweeps.watch import Run, Watch

    rng = random.Random(0)
    asha = Asha(eta=3, mode="min")
    names = [f"sweep-{i:08x}" for i in range(trials)]
    with tempfile.TemporaryDirectory() as d:
        run_dir = Path(d)
        rules = {"rungs": list(range(1, rungs + 1)), "eta": 3}
        record = SweepRecord.open(run_dir, "bench", rules, logging.getLogger("bench"))
        for name in names:
            record.add(name, {"lr": rng.random(), "model": {"dim": 64}})
            (run_dir / name).mkdir()
        t0 = time.perf_counter()
        judged, alive = 0, list(names)
        for rung in range(rungs):
            for name in alive:
                record.decide(vars(asha.judge(name, rung, rng.random() / (rung + 1))), "call")
                judged += 1
            alive = [n for n in alive if record.trials[n].decisions[-1]["keep"]]
        decide_s = time.perf_counter() - t0
        watch = Watch(run_dir, "bench", {**record.rules, "metric": "loss", "mode": "min", "window": 1}, record,
                       logging.getLogger("bench"))
        waiting = [Run(name, run_dir / name, _Waiting()) for name in names]
        t0 = time.perf_counter()
        assert len(watch.look(waiting)) == trials  # the workflow's look at trials waiting for a slot
        look_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        replayed = SweepRecord.replay(SweepRecord.path_of(run_dir, "bench"))
        replay_s = time.perf_counter() - t0
        assert replayed.order == record.order
        size = SweepRecord.path_of(run_dir, "bench").stat().st_size
    return {"decisions": judged, "decide_us": decide_s / judged * 1e6, "look_ms": look_s * 1e3,
            "replay_ms": replay_s * 1e3, "journal_kb": size / 1024}


def simulated_share(trials: int, rungs: list[int], steps: int, eta: int = 3, orders: int = 300) -> float:
    """The rank-steps ASHA uses against the grid's, averaged over ``orders`` random arrival orders of
    ``trials`` simulated trials (a quality each, a little noise at each rung, one at a time): how much
    the order in which trials reach the rungs decides, apart from any training."""
    from parsl_torch.apps.sweeps.asha import Asha

    share = 0.0
    for seed in range(orders):
        rng = random.Random(seed)
        quality = [rng.random() for _ in range(trials)]
        asha, used = Asha(eta, "min"), 0
        for i in rng.sample(range(trials), trials):
            reached = steps
            for k, at in enumerate(rungs):
                if not asha.judge(str(i), k, quality[i] + rng.gauss(0, 0.05) / (k + 1)).keep:
                    reached = at
                    break
            used += reached
        share += used / (trials * steps) / orders
    return share


class _Waiting:
    """A trial's future while Parsl holds its task for a free slot."""

    def done(self) -> bool:
        return False

    def task_status(self) -> str:
        return "pending"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=81)
    p.add_argument("--min-steps", type=int, default=3)
    p.add_argument("--dims", default="16,32,48,64", help="the widths of the space (times its 9 learning rates)")
    p.add_argument("--decisions-only", action="store_true")
    args = p.parse_args()
    cost = decisions_cost()
    print(f"decisions at 1,000 simulated trials: {cost['decisions']} judged and journaled, {cost['decide_us']:.0f} us "
          f"each; a look at 1,000 trials waiting for a slot {cost['look_ms']:.1f} ms (5 looks a second); the "
          f"journal ({cost['journal_kb']:.0f} KB) replayed by a rerun in {cost['replay_ms']:.0f} ms")
    rungs = [args.min_steps * 3 ** k for k in range(8) if args.min_steps * 3 ** k < args.steps]
    print(f"simulated: ASHA's rank-steps against the grid's, the mean over 300 random arrival orders: "
          + ", ".join(f"{n} trials {simulated_share(n, rungs, args.steps):.2f}" for n in (16, 27, 64)))
    if args.decisions_only:
        return
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "wf.py").write_text(WORKFLOW)
        dims = json.dumps([int(w) for w in args.dims.split(",")])
        out = subprocess.run([sys.executable, str(Path(d) / "wf.py"), str(Path(d) / "run"), str(args.steps),
                              str(args.min_steps), dims], capture_output=True, text=True,
                             env=bench_env(MPLBACKEND="Agg"), cwd=d, timeout=7200)
    if out.returncode:
        raise SystemExit(out.stderr[-4000:])
    r = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    grid, asha = r["none"], r["asha"]
    print(f"{grid['trials']} trials, {args.steps} steps each, rungs from {args.min_steps} (eta 3), one rank each, 2 at a time:\n"
          f"| | grid | asha | asha / grid |\n|---|---|---|---|\n"
          f"| rank-steps | {grid['rank_steps']} | {asha['rank_steps']} | {asha['rank_steps'] / grid['rank_steps']:.2f} |\n"
          f"| trials trained to the end | {grid['finished']} | {asha['finished']} | |\n"
          f"| best eval loss (its lr) | {grid['best']:.4f} ({grid['best_lr']:g}) | {asha['best']:.4f} "
          f"({asha['best_lr']:g}) | {asha['best'] / grid['best']:.3f} |\n"
          f"| wall s (with evaluations) | {grid['wall']:.1f} | {asha['wall']:.1f} | {asha['wall'] / grid['wall']:.2f} |")


if __name__ == "__main__":
    main()
