"""A trivial 2-rank train stage through a Globus Compute endpoint's own engine (GlobusMPIEngine,
started here by ``sites.engine.LocalEndpoint``; only the web service's hop is left out) against
the same stage through ``pt.workflow(site="local")``, in the same run: what the endpoint side adds
(its engine in its own process, the SDK's packing, the job that completes the identity there) to a stage. Each figure is a whole process: Parsl's
start, the stage, the shutdown.

usage: python benchmarks/bench_remote.py [--steps 20] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import yaml
from common import bench_env, timed

LOCAL = """
import sys, yaml, parsl_torch as pt
from parsl_torch.stages.train import train
with pt.workflow(site="local", run_dir=sys.argv[2]):
    train(yaml.safe_load(open(sys.argv[1])), ranks_per_node=2).result()
"""

THROUGH_ENGINE = """
import sys, yaml, parsl_torch as pt
from parsl_torch.sites.endpoint import endpoint_config
from parsl_torch.sites.engine import LocalEndpoint
from parsl_torch.stages.train import train
with LocalEndpoint(endpoint_config(pt.sites.load("local").spec, sys.prefix), sys.argv[2] + "-engine") as ep:
    with pt.workflow(site="engine", run_dir=sys.argv[2], gc_executor=ep.executor()):
        train(yaml.safe_load(open(sys.argv[1])), ranks_per_node=2).result()
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "sites").mkdir()
        (tmp / "sites" / "engine.yaml").write_text(yaml.safe_dump({
            "name": "engine", "scheduler": "globus", "launch": {"ranks_per_node": 2},
            "globus": {"endpoint_id": "00000000-0000-4000-8000-000000000000",
                       "remote_run_dir": str(tmp / "remote")}}))
        env = bench_env(PARSL_TORCH_SCHEDULER="local", PARSL_TORCH_SITE_PATH=str(tmp / "sites"))
        config = tmp / "train.yaml"
        config.write_text(yaml.safe_dump({"steps": args.steps, "checkpoint_every": args.steps, "log_every": 10,
                                          "model": {"dim": 32, "n_heads": 2, "n_layers": 1, "seq_len": 16}}))
        (tmp / "local.py").write_text(LOCAL)
        (tmp / "engine.py").write_text(THROUGH_ENGINE)
        locals_, engines = [], []
        for rep in range(args.reps):  # alternate, so drift on a shared machine hits both alike
            locals_.append(timed([sys.executable, str(tmp / "local.py"), str(config), str(tmp / f"l{rep}")], env))
            engines.append(timed([sys.executable, str(tmp / "engine.py"), str(config), str(tmp / f"e{rep}")], env))
    local, engine = statistics.median(locals_), statistics.median(engines)
    print(f"trivial train stage ({args.steps} steps, 2 ranks), whole process, median of {args.reps}: "
          f"through the endpoint's engine {engine:.1f} s, pt.workflow(site='local') {local:.1f} s -> "
          f"{engine / local:.2f}x ({engine - local:+.1f} s)")


if __name__ == "__main__":
    main()
