"""A sweep over learning rates (and widths): poor trials stopped early (ASHA), the ones that finish
evaluated, the best by evaluation loss wins.

    parsl-torch run workflows/sweep.py [--lrs 0.001 0.003 0.01] [--dims 32 64] [--scheduler asha|none]
                                       [--steps 100] [--site auto] [--run-dir runs/sweep]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import yaml

import parsl_torch as pt
from parsl_torch.stages.evaluate import evaluate

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2])
    p.add_argument("--dims", type=int, nargs="+", help="model widths to sweep too (default: the config's)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--scheduler", choices=("asha", "none"), default="asha")
    p.add_argument("--min-steps", type=int, help="the first rung (default: steps // eta**3)")
    p.add_argument("--eta", type=int, default=3)
    p.add_argument("--site", default=os.environ.get("PARSL_TORCH_SITE", "auto"))
    p.add_argument("--run-dir", default="runs/sweep")
    p.add_argument("--fresh", action="store_true")
    p.add_argument("--account")
    args = p.parse_args(argv)

    space = {"lr": args.lrs, **({"model.dim": args.dims} if args.dims else {})}
    eval_cfg = yaml.safe_load((CONFIGS / "eval.yaml").read_text())
    with pt.workflow(site=args.site, run_dir=args.run_dir, fresh=args.fresh, account=args.account) as wf:
        trials = pt.sweep(space, base=CONFIGS / "train.yaml", steps=args.steps, scheduler=args.scheduler,
                          min_steps=args.min_steps, eta=args.eta)
        finished = [t for t in trials if t.state == "finished"]
        evals = [(t, evaluate({**eval_cfg, "model": t.config["model"]}, inputs=[t.result["checkpoint"]],
                              stage=f"evaluate-{t.name}")) for t in finished]
        done = pt.report.summaries([e for _, e in evals])
    print(pt.report.table(done, wf.run_dir))
    for t in trials:
        print(f"{t.name}: lr={t.config['lr']:g} dim={t.config['model'].get('dim')} {t.state} {t.why}")
    best_trial, best = min(((t, e.result()) for t, e in evals), key=lambda r: r[1]["eval_loss"])
    print(f"\nbest: lr={best_trial.config['lr']:g} ({best_trial.name}) with eval_loss={best['eval_loss']:.4g} "
          f"(eval_acc={best['eval_acc']:.3f}); {len(trials) - len(finished)} of {len(trials)} trials stopped early")
    print(f"report: {pt.report.write_report(done, wf.run_dir, 'learning-rate sweep')}")


if __name__ == "__main__":
    main()
