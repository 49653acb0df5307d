"""Several train -> evaluate chains in parallel, one per learning rate; the
best by evaluation loss wins.

    parsl-torch run workflows/sweep.py [--lrs 0.001 0.003 0.01] [--site auto] [--run-dir runs/sweep]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import yaml

import parsl_torch as pt
from parsl_torch.stages.evaluate import evaluate
from parsl_torch.stages.train import train

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--site", default=os.environ.get("PARSL_TORCH_SITE", "auto"))
    p.add_argument("--run-dir", default="runs/sweep")
    p.add_argument("--fresh", action="store_true")
    p.add_argument("--account")
    args = p.parse_args(argv)

    base = yaml.safe_load((CONFIGS / "train.yaml").read_text())
    eval_cfg = str(CONFIGS / "eval.yaml")
    with pt.workflow(site=args.site, run_dir=args.run_dir, fresh=args.fresh, account=args.account) as wf:
        chains = []
        for lr in args.lrs:  # all chains are submitted at once; Parsl runs them as slots free up
            t = train({**base, "lr": lr, "steps": args.steps}, stage=f"train-lr{lr:g}")
            e = evaluate(eval_cfg, inputs=[t.outputs[1]], stage=f"evaluate-lr{lr:g}")
            chains.append((lr, t, e))
        done = pt.report.summaries([f for _, t, e in chains for f in (t, e)])
    best_lr, best = min(((lr, e.result()) for lr, _, e in chains), key=lambda r: r[1]["eval_loss"])
    print(pt.report.table(done, wf.run_dir))
    print(f"\nbest: lr={best_lr:g} with eval_loss={best['eval_loss']:.4g} (eval_acc={best['eval_acc']:.3f})")
    print(f"report: {pt.report.write_report(done, wf.run_dir, 'learning-rate sweep')}")


if __name__ == "__main__":
    main()
