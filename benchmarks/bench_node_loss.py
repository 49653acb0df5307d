"""On the multi-node test cluster (tests/cluster, root): the time from a node's loss to the first
training step after it, and the steps trained again, when the stage's retry starts on a spare node of
the same block (``mpi.spare_nodes: 1``; it resumes from the state kept in node memory), when it goes on
in place with the node left (``min_nodes=1``, a 2-node block: the same launch's supervisor, no retry
through Parsl), against a full requeue (the stage fails; the workflow runs again in a new batch job:
here on the same nodes, whose memory still holds the state; elsewhere, the file checkpoint), measured in
the same run. A 2-node x 2-rank
train with a file checkpoint every 20 steps and a state in node memory every 2; rank 2 (on n2) stops at step 26, n2 is lost (link down,
its processes killed); NODE_TIMEOUT 10 s names it.

usage: sudo python benchmarks/bench_node_loss.py [--node-timeout 10]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import cluster_env, site_variant

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "cluster"))
import cluster  # noqa: E402  (the test harness)

WORKFLOW = """
import sys, parsl_torch as pt
from parsl_torch.stages.train import train
with pt.workflow(site=sys.argv[1], run_dir=sys.argv[2], retries=int(sys.argv[3])):
    min_nodes = int(sys.argv[5]) if len(sys.argv) > 5 else None
    print(train(sys.argv[4], num_nodes=2, ranks_per_node=2, min_nodes=min_nodes).result()["resumed_from"])
"""
STOP_AT = 26
CHECKPOINT_EVERY = 20
#: a state kept in node memory every this many steps (the measured default keeps them rarer on steps as
#: short as this model's, 5 ms: its history's sync costs more than 2 % of them)
SNAPSHOT_EVERY = 2


def _first_step_after(progress: Path, step: int, since: float, limit: float = 300) -> float:
    """Seconds from ``since`` until rank 0's progress record passes ``step``."""
    while time.perf_counter() - since < limit:
        try:
            if json.loads(progress.read_text())["step"] > step:
                return time.perf_counter() - since
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"no step after {step} within {limit:g} s")


def _resumed(proc: subprocess.Popen) -> int:
    """The step the workflow's train resumed from (its last line)."""
    out, _ = proc.communicate(timeout=300)
    return int((out.decode() if isinstance(out, bytes) else out).strip().splitlines()[-1])


def one(env: dict[str, str], tmp: Path, site: str, retries: int, name: str,
        *extra: str) -> tuple[subprocess.Popen, Path]:
    run = tmp / name
    once = tmp / f"{name}.once"
    proc = subprocess.Popen([sys.executable, str(tmp / "wf.py"), site, str(run), str(retries), str(tmp / "train.yaml"),
                             *extra],
                            env={**env, "PARSL_TORCH_FAULT": f"hang@2:{STOP_AT}:{once}"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    while not once.exists():
        time.sleep(0.05)
    return proc, run / "train" / "train.h5.progress.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node-timeout", type=float, default=10.0)
    args = p.parse_args()
    cluster.up(3)
    try:
        with tempfile.TemporaryDirectory(dir="/tmp") as d:
            tmp = Path(d)
            site_variant(tmp / "sites", "nspbs", "nsspare", provider={"nodes_per_block": 3}, mpi={"spare_nodes": 1})
            env = cluster_env(cluster, tmp / "sites", PARSL_TORCH_NODE_TIMEOUT=str(args.node_timeout),
                              PARSL_TORCH_TIMEOUT="60")
            (tmp / "train.yaml").write_text(yaml.safe_dump({
                "steps": 40, "checkpoint_every": CHECKPOINT_EVERY, "snapshot_every": SNAPSHOT_EVERY, "log_every": 1,
                "model": {"kind": "mlp", "vocab_size": 32, "dim": 32, "seq_len": 16}, "data": {"batch_size": 16}}))
            (tmp / "wf.py").write_text(WORKFLOW)

            proc, progress = one(env, tmp, "nsspare", 1, "spare")
            lost = time.perf_counter()
            cluster.lose_node("n2")
            spare = _first_step_after(progress, STOP_AT + 1, lost)
            spare_from = _resumed(proc)
            cluster.restart_node("n2")

            proc, progress = one(env, tmp, "nspbs", 1, "elastic", "1")
            lost = time.perf_counter()
            cluster.lose_node("n2")
            elastic = _first_step_after(progress, STOP_AT + 1, lost)
            elastic_from = _resumed(proc)
            cluster.restart_node("n2")

            proc, progress = one(env, tmp, "nspbs", 0, "requeue")
            lost = time.perf_counter()
            cluster.lose_node("n2")
            proc.communicate(timeout=300)  # the stage fails, naming n2
            cluster.restart_node("n2")  # (the scheduler's replacement node)
            rerun = subprocess.Popen([sys.executable, str(tmp / "wf.py"), "nspbs", str(tmp / "requeue"), "0",
                                      str(tmp / "train.yaml")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            requeue = _first_step_after(progress, STOP_AT + 1, lost)
            requeue_from = _resumed(rerun)
    finally:
        cluster.down(quiet=True)
    print("node loss -> first training step after it (2 nodes x 2 ranks, NODE_TIMEOUT "
          f"{args.node_timeout:g} s):\n"
          "| recovery | seconds | steps trained again |\n|---|---|---|\n"
          f"| retry on a spare node of the same block (mpi.spare_nodes: 1) | {spare:.1f} | {STOP_AT - spare_from} |\n"
          f"| in place on the node left, 2 ranks (min_nodes=1) | {elastic:.1f} | {STOP_AT - elastic_from} |\n"
          f"| full requeue (the stage fails, the workflow runs again in a new job) | {requeue:.1f} | "
          f"{STOP_AT - requeue_from} |\n"
          f"-> the spare is {requeue / spare:.2f}x, elastic {requeue / elastic:.2f}x faster than the requeue; all include the {args.node_timeout:g} s in which "
          f"the node is named lost; the requeue's new job starts at once here (fake PBS), where a real queue "
          f"adds its wait (ezpz publishes 9-11 s per resume on Sunspot, after its own detection)")


if __name__ == "__main__":
    main()
