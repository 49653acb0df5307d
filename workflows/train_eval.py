"""The main job: train a model on N ranks, evaluate its checkpoint, report.

    parsl-torch run workflows/train_eval.py [--site auto] [--run-dir runs/train_eval] [--fresh]
    python workflows/train_eval.py ...                       (the same)

The same script runs on a laptop (site local), on Aurora, Polaris or Frontier
(picked by hostname, or --site). Rerunning with the same --run-dir skips the
stages that finished; --fresh starts over.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import parsl_torch as pt
from parsl_torch.stages.config import load_config
from parsl_torch.stages.evaluate import EvalConfig, evaluate
from parsl_torch.stages.train import TrainConfig, train

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--site", default=os.environ.get("PARSL_TORCH_SITE", "auto"))
    p.add_argument("--run-dir", default="runs/train_eval")
    p.add_argument("--fresh", action="store_true", help="delete the run directory's results first")
    p.add_argument("--train-config", default=str(CONFIGS / "train.yaml"))
    p.add_argument("--eval-config", default=str(CONFIGS / "eval.yaml"))
    p.add_argument("--nodes", type=int, default=1, help="nodes per stage")
    p.add_argument("--ranks-per-node", type=int, help="default: the site's")
    p.add_argument("--min-nodes", type=int, help="train goes on with this many nodes after losing some "
                   "(with --retries; default: all --nodes)")
    p.add_argument("--retries", type=int, default=1, help="reruns of a failed stage (train resumes)")
    p.add_argument("--account", help="batch sites: the allocation to charge")
    args = p.parse_args(argv)

    # checked before anything starts: a bad field fails here, naming the file and field
    train_cfg = load_config(args.train_config, TrainConfig, "train")
    eval_cfg = load_config(args.eval_config, EvalConfig, "evaluate")
    resources = {"num_nodes": args.nodes, "ranks_per_node": args.ranks_per_node}
    with pt.workflow(site=args.site, run_dir=args.run_dir, fresh=args.fresh, retries=args.retries,
                     account=args.account) as wf:
        trained = train(train_cfg, outputs=["train.h5", "model.pt"], min_nodes=args.min_nodes, **resources)
        evaluated = evaluate(eval_cfg, inputs=[trained.outputs[1]], outputs=["eval.h5"], **resources)
        done = pt.report.summaries([trained, evaluated])
    print(pt.report.table(done, wf.run_dir))
    print(f"\nreport: {pt.report.write_report(done, wf.run_dir, 'train -> evaluate')}")


if __name__ == "__main__":
    main()
