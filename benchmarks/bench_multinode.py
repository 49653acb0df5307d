"""On the multi-node test cluster (tests/cluster, root): a 2-node x 2-rank
train stage through the workflow (Slurm site, blocks of 2 nodes) against the
same stage module under bare ``srun -N 2`` in the same run, and the time from
a node's loss (link down, then its PID 1 killed) to the launch's error.

usage: sudo python benchmarks/bench_multinode.py [--steps 1000] [--node-timeout 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import BIN, bench_env, timed

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "cluster"))
import cluster  # noqa: E402  (the test harness)

WORKFLOW = """
import sys, parsl_torch as pt
from parsl_torch.stages.train import train
with pt.workflow(site="nsslurm", run_dir=sys.argv[2]):
    print(train(sys.argv[1], num_nodes=2, ranks_per_node=2).result()["final_loss"])
"""


def node_loss(env: dict[str, str], tmp: Path, node_timeout: float) -> tuple[float, str]:
    """Seconds from losing n2 to the launch's exit, and its message."""
    markers = tmp / "markers"
    command = (f"cd {REPO} && PBS_JOBID=1.bench PBS_NODEFILE={tmp / 'nodes'} PARSL_TORCH_NODE_TIMEOUT={node_timeout} "
               f"{BIN}/parsl-torch launch --ppn 2 -- {sys.executable} tests/ranks/allreduce_loop.py {markers} 300")
    (tmp / "nodes").write_text("n1\nn2\n")
    exports = " ".join(f"{k}={v}" for k, v in env.items() if k in ("PATH", "HYDRA_LAUNCHER", "HYDRA_LAUNCHER_EXEC",
                                                                    "UCX_TLS", "OMP_NUM_THREADS"))
    proc = subprocess.Popen([str(cluster.HERE / "bin" / "nsexec"), "n1", f"export {exports}; {command}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not (markers / "rank3").exists():
        time.sleep(0.05)
    lost = time.perf_counter()
    cluster.lose_node("n2")
    _, err = proc.communicate(timeout=600)
    took = time.perf_counter() - lost
    cluster.restart_node("n2")
    return took, next((line for line in err.splitlines() if "lost" in line), err[-300:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--node-timeout", type=float, default=10.0)
    args = p.parse_args()
    cluster.up(3)
    try:
        env = bench_env(**cluster.env_lines(cluster.node_names(3)),
                        SLURM_CONF=str(cluster.STATE / "slurm" / "slurm.conf"),
                        PARSL_TORCH_SITE_PATH=str(REPO / "tests" / "sites"))
        env["PATH"] = f"{BIN}:/usr/local/sbin:/usr/sbin:/sbin:{env['PATH']}"
        with tempfile.TemporaryDirectory(dir="/tmp") as d:
            tmp = Path(d)
            cfg = tmp / "train.yaml"
            cfg.write_text(yaml.safe_dump({"steps": args.steps, "checkpoint_every": args.steps,
                                           "log_every": args.steps, "data": {"batch_size": 16}}))
            (tmp / "wf.py").write_text(WORKFLOW)
            bare, flow = [], []
            for rep in range(args.reps):
                bare.append(timed(["srun", "-N", "2", "--ntasks-per-node", "2", sys.executable, "-m",
                                   "parsl_torch.stages.train", "--config", str(cfg), "--history",
                                   str(tmp / f"bare{rep}.h5"), "--checkpoint", str(tmp / f"bare{rep}.pt")], env))
                flow.append(timed([sys.executable, str(tmp / "wf.py"), str(cfg), str(tmp / f"run{rep}")], env))
            b, w = statistics.median(bare), statistics.median(flow)
            print(f"2 nodes x 2 ranks, {args.steps} steps: bare srun -N 2 {b:.1f} s, workflow (Slurm site) "
                  f"{w:.1f} s -> {w / b:.2f}x (+{w - b:.1f} s: batch job, worker pool, supervisor)")
            took, message = node_loss(env, tmp, args.node_timeout)
            print(f"node loss -> launch error: {took:.1f} s with PARSL_TORCH_NODE_TIMEOUT={args.node_timeout:g} "
                  f"(collective timeout 300 s)\n  {message.strip()}")
    finally:
        cluster.down(quiet=True)


if __name__ == "__main__":
    main()
