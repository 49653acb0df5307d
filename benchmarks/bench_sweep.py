"""A sweep as a grid, with ASHA, with pause and promote and as the one-short-budget baseline, side by side,
three runs (``pt.sweep``, docs/sweeps.md):

1. the same space (36 trials of the built-in Transformer: 9 learning rates, poor at both ends, times 4
   widths) trained to the same budget as a grid (``scheduler="none"``), with ``asha`` (poor trials
   stop), with ``asha-promote`` (they pause and may be promoted), and as the baseline of Egele et al.
   (2023): every configuration to ``min_steps``, the best k of them to the end (trained anew: a longer
   budget is another computation; k the fewest that spend at least pause-and-promote's rank-steps, or
   ``--top``); one rank each, two at a time (the local site's slots), in one workflow; every trial that
   finishes is evaluated. Printed per run: the rank-steps each used against the grid's, the best
   evaluation loss each found against the grid's, the sweeps' wall time, the share of the slots' time
   that trials held (from each attempt's start, as its supervisor recorded it, to its end), and
   whether pause and promote met the issue's marks;
2. what the decisions cost the workflow process at 1,000 simulated trials: each judged at 4 rungs, the
   record written after each look, and one look at 1,000 trials that wait for a slot.

   Before it, the promotion form simulated against ASHA's stopping form and the baseline over 300
   random arrival orders (``simulated_promotion``), and where the grid's best configuration stands at the
   rungs by the training loss and by the held-out loss (``held_out_places``: whether a rule judging on
   either could keep it).

usage: python benchmarks/bench_sweep.py [--steps 81] [--min-steps 3] [--dims 16,32,48,64] [--top K] [--runs 3]
       [--decisions-only]   (``--dims 16,32,48``: 27 trials; ``--dims 16,24,32,40,48,56,64``: 63)
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
import json, math, sys, time
from pathlib import Path
import parsl_torch as pt
from parsl_torch.apps.sweeps.journal import SweepRecord
from parsl_torch.apps.sweeps.trialfiles import rung_value
from parsl_torch.stages.evaluate import evaluate

steps, min_steps, dims = int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
model = {"kind": "transformer", "vocab_size": 64, "dim": 32, "n_heads": 2, "n_layers": 1, "seq_len": 32}
base = {"model": model, "data": {"batch_size": 16}, "checkpoint_every": 1000, "log_every": 1000}
space = {"lr": json.loads(sys.argv[6]), "model.dim": dims}
top = int(sys.argv[5])
out = {}


def evaluated(trials):  # each finished trial's evaluation loss
    evals = {t.name: evaluate({"model": t.config["model"], "batches": 8}, inputs=[t.result["checkpoint"]],
                              stage=f"eval-{t.name}", ranks_per_node=1)
             for t in trials if t.state == "finished"}
    return {name: e.result()["eval_loss"] for name, e in evals.items()}


def busy(*names):  # the slot-seconds the sweeps' trials held (their journals)
    return sum(t.busy_s or 0.0 for n in names
               for t in SweepRecord.replay(SweepRecord.path_of(Path(sys.argv[1]), n)).trials.values())


def summary(trials, wall, rank_steps, *names):  # (wall: the sweeps', measured before their trials' evaluations)
    losses = evaluated(trials)
    best = min(trials, key=lambda t: losses.get(t.name, 1e9))
    return {"wall": wall, "rank_steps": rank_steps, "best": min(losses.values()), "finished": len(losses),
            "trials": len(trials), "best_lr": best.config["lr"], "best_name": best.name,
            "near": sorted(n for n, v in losses.items() if v <= 1.01 * min(losses.values())),
            "busy": busy(*names) / (2 * wall)}


def places(trials, best, rules):  # a grid trial's place at each rung, by the value the rule judges there
    seen = {}
    for t in trials:
        h = pt.read_history(t.result["history"])
        values = h.stats.get(rules["metric"], {}).get("mean", h.metrics[rules["metric"]])
        seen[t.name] = dict(zip(h.steps.tolist(), values.tolist()))
    return [sorted(seen, key=lambda n: rung_value(seen[n], at, rules["window"])).index(best) + 1
            for at in rules["rungs"]]


with pt.workflow(site="local", run_dir=sys.argv[1]):
    for scheduler in ("none", "asha", "asha-promote"):
        t0 = time.perf_counter()
        trials = pt.sweep(space, base=base, steps=steps, min_steps=min_steps, eta=3, scheduler=scheduler,
                          name=scheduler, ranks_per_node=1)
        out[scheduler] = summary(trials, time.perf_counter() - t0, sum(t.step for t in trials), scheduler)
        grid = trials if scheduler == "none" else grid
    promote_rules = SweepRecord.replay(SweepRecord.path_of(Path(sys.argv[1]), "asha-promote")).rules
    out["none"]["places"] = {n: places(grid, n, promote_rules) for n in out["none"]["near"]}
    out["none"]["rungs"] = promote_rules["rungs"]
    # the one-short-budget baseline: every configuration to min_steps, the best k of them to the end (k: the
    # fewest that spend at least pause-and-promote's rank-steps, unless given)
    t0 = time.perf_counter()
    short = pt.sweep(space, base=base, steps=min_steps, scheduler="none", name="short", ranks_per_node=1)
    used = sum(t.step for t in short)
    top = top or max(1, math.ceil((out["asha-promote"]["rank_steps"] - used) / steps))
    kept = sorted(short, key=lambda t: t.value)[:top]
    trials = pt.sweep([{k: v for k, v in t.config.items() if k != "steps"} for t in kept], base=base, steps=steps,
                      scheduler="none", name="baseline", ranks_per_node=1)
    out["baseline"] = summary(trials, time.perf_counter() - t0, used + sum(t.step for t in trials), "short", "baseline")
    out["baseline"]["top"] = top
print("RESULT " + json.dumps(out))
"""

SCHEMES = ("none", "asha", "asha-promote", "baseline")
LRS = [1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1]


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
        rules = {**record.rules, "metric": "loss", "mode": "min", "window": 1, "scheduler": "asha"}
        watch = Watch("bench", rules, record, logging.getLogger("bench"))
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


def simulated_promotion(trials: int, rungs: list[int], steps: int, eta: int = 3, slots: int = 2, top: int = 6,
                        orders: int = 300, late: float = 0.0) -> dict[str, tuple[float, float]]:
    """What the pause-and-promote form of the rule would use, against ASHA's stopping form and the
    one-short-budget baseline (every trial to the first rung, the best ``top`` of them to the end), over
    ``orders`` random arrival orders of ``trials`` simulated trials on ``slots`` slots (a step a unit of
    time; a quality each, a little noise at each rung, and with ``late`` a head start or a slow start each,
    up to ``late`` at the first rung and gone by the end: the short-horizon bias): per scheme, the mean of its
    rank-steps against the grid's and the share of orders in which it trained the best trial to the end."""

    totals = {"asha": [0.0, 0.0], "asha-promote": [0.0, 0.0], "baseline": [0.0, 0.0]}
    for seed in range(orders):
        rng = random.Random(seed)
        quality = [rng.random() for _ in range(trials)]
        start = [rng.uniform(-late, late) for _ in range(trials)]
        seen = [[quality[i] + start[i] * (1 - rungs[k] / steps) + rng.gauss(0, 0.05) / (k + 1) for k in range(len(rungs))]
                for i in range(trials)]
        order = rng.sample(range(trials), trials)
        best = min(range(trials), key=quality.__getitem__)
        for scheme, (used, finished) in (("asha", _stopping(order, seen, rungs, steps, eta)),
                                          ("asha-promote", _promoting(order, seen, rungs, steps, eta, slots)),
                                          ("baseline", _baseline(seen, rungs, steps, top))):
            totals[scheme][0] += used / (trials * steps) / orders
            totals[scheme][1] += (best in finished) / orders
    return {scheme: (share, found) for scheme, (share, found) in totals.items()}


def _stopping(order: list[int], seen: list[list[float]], rungs: list[int], steps: int, eta: int) -> tuple[int, set]:
    from parsl_torch.apps.sweeps.asha import Asha

    asha, used, finished = Asha(eta, "min"), 0, set()
    for i in order:
        reached = next((at for k, at in enumerate(rungs) if not asha.judge(str(i), k, seen[i][k]).keep), steps)
        used += reached
        finished |= {i} if reached == steps else set()
    return used, finished


def _promoting(order: list[int], seen: list[list[float]], rungs: list[int], steps: int, eta: int,
               slots: int) -> tuple[int, set]:
    """Event by event, as ``pt.sweep`` decides (``Promotions``): a trial at a rung goes on if it is in the
    rung's best 1/eta so far, else it pauses; a free slot takes the paused trial that ranks now (highest
    rung first) before a new one."""
    import heapq

    from parsl_torch.apps.sweeps.asha import Asha, Promotions

    asha, new, running = Asha(eta, "min", promoting=True), list(order), []
    promotions = Promotions(asha)  # (trial names: str(i))
    reached, finished, now = {}, set(), 0.0

    def start(i: int, k: int) -> None:  # from rung k-1 (its step) to rung k, or to the end
        at = rungs[k] if k < len(rungs) else steps
        heapq.heappush(running, (now + at - (rungs[k - 1] if k else 0), i, k))

    while True:
        while len(running) < slots and ((p := promotions.next()) or new):
            if p:
                del promotions.paused[p[0]]
                start(int(p[0]), p[1] + 1)
            else:
                start(new.pop(0), 0)
        if not running:
            break
        now, i, k = heapq.heappop(running)
        if k == len(rungs):
            reached[i] = steps
            finished.add(i)
        elif asha.judge(str(i), k, seen[i][k]).keep:
            start(i, k + 1)
        else:
            promotions.paused[str(i)], reached[i] = (k, seen[i][k]), rungs[k]
    return sum(reached.values()), finished


def _baseline(seen: list[list[float]], rungs: list[int], steps: int, top: int) -> tuple[int, set]:
    kept = sorted(range(len(seen)), key=lambda i: seen[i][0])[:top]
    return len(seen) * rungs[0] + top * steps, set(kept)


def held_out_places(steps: int, rungs: list[int], dims: list[int], window: int) -> dict[str, list[int]]:
    """Where the grid's best configuration (by the evaluation loss at the end) stands at each rung among all of
    the space's, by the training loss the rungs judge and by the held-out loss itself: the same trials trained
    in this process as the train stage trains them (seed, model, optimizer, data), evaluated as the evaluate
    stage does (8 held-out batches). Whether judging on a held-out metric would let a rule find it."""
    import torch
    import torch.nn.functional as F

    from parsl_torch.stages.config import DataConfig, ModelConfig
    from parsl_torch.stages.data import batch
    from parsl_torch.stages.model import build_model

    torch.set_num_threads(1)
    train, held, seen = DataConfig(batch_size=16), DataConfig(seed=10_000, batch_size=16), {}
    for dim in dims:
        model_cfg = ModelConfig(kind="transformer", vocab_size=64, dim=dim, n_heads=2, n_layers=1, seq_len=32)
        held_out = [batch(held, model_cfg, b, 0, 1) for b in range(8)]
        for lr in LRS:
            torch.manual_seed(0)
            model = build_model(model_cfg)
            opt = torch.optim.AdamW(model.parameters(), lr=lr)

            def loss(tokens):
                return F.cross_entropy(model(tokens[:, :-1]).reshape(-1, 64).float(), tokens[:, 1:].reshape(-1))

            losses, evals = [], {}
            for step in range(steps + 1):
                if step in rungs or step == steps:
                    with torch.no_grad():
                        evals[step] = sum(loss(t).item() for t in held_out) / len(held_out)
                if step < steps:
                    value = loss(batch(train, model_cfg, step, 0, 1))
                    opt.zero_grad()
                    value.backward()
                    opt.step()
                    losses.append(value.item())
            seen[(lr, dim)] = (losses, evals)
    best = min(seen, key=lambda c: seen[c][1][steps])

    def place(value) -> list[int]:
        return [sorted(seen, key=lambda c: value(c, at)).index(best) + 1 for at in rungs]

    return {"best": best, "training loss": place(lambda c, at: sum(seen[c][0][at - window:at]) / window),
            "held-out loss": place(lambda c, at: seen[c][1][at])}


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
    p.add_argument("--top", type=int, default=0, help="the baseline: how many of the short trials go on to the end "
                   "(default: the fewest that spend at least asha-promote's rank-steps)")
    p.add_argument("--runs", type=int, default=3, help="workflows run, one after the other (each prints its table)")
    p.add_argument("--decisions-only", action="store_true")
    args = p.parse_args()
    cost = decisions_cost()
    print(f"decisions at 1,000 simulated trials: {cost['decisions']} judged and journaled, {cost['decide_us']:.0f} us "
          f"each; a look at 1,000 trials waiting for a slot {cost['look_ms']:.1f} ms (5 looks a second); the "
          f"journal ({cost['journal_kb']:.0f} KB) replayed by a rerun in {cost['replay_ms']:.0f} ms")
    rungs = [args.min_steps * 3 ** k for k in range(8) if args.min_steps * 3 ** k < args.steps]
    print("simulated: ASHA's rank-steps against the grid's, the mean over 300 random arrival orders: "
          + ", ".join(f"{n} trials {simulated_share(n, rungs, args.steps):.2f}" for n in (16, 27, 64)))
    n = 9 * len(args.dims.split(","))
    for late in (0.0, 0.5):
        sim = simulated_promotion(n, rungs, args.steps, top=args.top or 6, late=late)
        print(f"simulated, {n} trials on 2 slots, 300 random arrival orders, starts differing by up to {late:g} "
              f"(qualities 0-1): rank-steps against the grid's (mean), and how often the best trial was trained to "
              f"the end: " + "; ".join(f"{scheme} {share:.2f}, {found:.0%}" for scheme, (share, found) in sim.items()))
    if args.decisions_only:
        return
    dims = [int(w) for w in args.dims.split(",")]
    places = held_out_places(args.steps, rungs, dims, max(1, args.min_steps // 2))
    lr, dim = places.pop("best")
    print(f"the grid's best configuration (lr {lr:g}, width {dim}), trained in this process: its place among the "
          f"{len(LRS) * len(dims)} at steps {', '.join(map(str, rungs))}: " + "; ".join(
              f"by the {how} {', '.join(map(str, at))}" for how, at in places.items()))
    for run in range(1, args.runs + 1):
        _report(run, _one_run(args), args)


def _one_run(args: argparse.Namespace) -> dict[str, dict]:
    """One workflow: the four schemes one after the other, each trial finished evaluated."""
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "wf.py").write_text(WORKFLOW)
        dims = json.dumps([int(w) for w in args.dims.split(",")])
        out = subprocess.run([sys.executable, str(Path(d) / "wf.py"), str(Path(d) / "run"), str(args.steps),
                              str(args.min_steps), dims, str(args.top), json.dumps(LRS)], capture_output=True, text=True,
                             env=bench_env(MPLBACKEND="Agg"), cwd=d, timeout=7200)
    if out.returncode:
        raise SystemExit(out.stderr[-4000:])
    return json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])


def _report(run: int, r: dict[str, dict], args: argparse.Namespace) -> None:
    grid, promote, base = r["none"], r["asha-promote"], r["baseline"]
    print(f"\nrun {run}: {grid['trials']} trials, {args.steps} steps each, rungs from {args.min_steps} (eta 3), one "
          f"rank each, 2 at a time; the baseline: every trial to {args.min_steps} steps, the best {base['top']} to "
          f"the end\n| | grid | asha | asha-promote | baseline |\n|---|---|---|---|---|")
    rows = (("rank-steps (/ grid)", "rank_steps", "{:.0f}"), ("trials trained to the end", "finished", "{}"),
            ("best eval loss (/ grid)", "best", "{:.4f}"), ("its lr", "best_lr", "{:g}"),
            ("wall s, sweeps (/ grid)", "wall", "{:.1f}"), ("slot-time busy", "busy", "{:.0%}"))
    for label, key, fmt in rows:
        cells = [fmt.format(r[scheme][key]) + (f" ({r[scheme][key] / grid[key]:.2f})" if "/ grid" in label and
                                               scheme != "none" else "") for scheme in SCHEMES]
        print(f"| {label} | {' | '.join(cells)} |")
    checks = {"within 1 % of the grid's best": promote["best"] <= 1.01 * grid["best"],
              "at most 25 % of its rank-steps": promote["rank_steps"] <= 0.25 * grid["rank_steps"],
              "at least as good as the baseline": promote["best"] <= base["best"],
              "at no more compute": promote["rank_steps"] <= base["rank_steps"],
              "slots busy at least 90 %": promote["busy"] >= 0.9}
    print(f"run {run}, asha-promote: " + "; ".join(f"{k}: {'yes' if ok else 'NO'}" for k, ok in checks.items()))
    print(f"run {run}: {len(grid['near'])} of the grid's {grid['trials']} trials within 1 % of its best; their "
          f"places at steps {', '.join(map(str, grid['rungs']))} by the loss the rungs judge: " + "; ".join(
              ", ".join(map(str, at)) for at in grid["places"].values()) +
          " (a rule that keeps each rung's best third goes on with one only where it is among them)")


if __name__ == "__main__":
    main()
