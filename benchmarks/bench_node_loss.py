"""On the multi-node test cluster (tests/cluster, root): the time from a node's loss to the first
training step after it, and the steps trained again, side by side in one run: in place on a spare of the
same block with the ranks kept up (``mpi.spare_nodes: 1``: the spare's ranks wait from the stage's start, the
supervisor brings them in for the lost node's and the other node's ranks fork their training anew, all at a fresh
rendezvous: ``launch.standby``), the same with every rank started again (the supervisor claims the spare and
launches the same ranks again there, within the same call; ``PARSL_TORCH_WAITING_SPARES=0``; both resume from the
state kept in node memory), a retry on a spare through
Parsl (a warm stage, whose group ends with its node), in place on the node left (``min_nodes=1``), and a
full requeue (the stage fails; the workflow runs again in a new batch job: here on the same nodes, whose
memory still holds the state; elsewhere, the file checkpoint). A 2-node x 2-rank train with a file
checkpoint every 20 steps and a state in node memory every 2; rank 2 (on n2) stops at step 26, n2 is lost
(link down, its processes killed); NODE_TIMEOUT 10 s names it. Then what the spare's waiting ranks cost a
stage that loses no node (its wall time with them and without), and what keeping the state costs.

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
site, run_dir, retries, config, min_nodes, warm = sys.argv[1:]
with pt.workflow(site=site, run_dir=run_dir, retries=int(retries), warm=warm == "warm"):
    print(train(config, num_nodes=2, ranks_per_node=2, min_nodes=int(min_nodes) or None).result()["resumed_from"])
"""
STOP_AT = 26
CHECKPOINT_EVERY = 20
#: a state kept in node memory every this many steps (the measured default keeps them rarer on steps as
#: short as this model's, 5 ms: its history's sync costs more than 2 % of them)
SNAPSHOT_EVERY = 2
#: (name, site, min_nodes, warm, environment) of each recovery measured, before the full requeue
CASES = (("kept", "nsspare", 0, False, {}), ("spare", "nsspare", 0, False, {"PARSL_TORCH_WAITING_SPARES": "0"}),
         ("retry", "nsspare", 0, True, {}), ("elastic", "nspbs", 1, False, {}))
LABELS = {"kept": "in place, the ranks kept up: the spare's waiting since the stage began, n1's forked anew "
                  "(the default)",
          "spare": "in place on a spare, every rank started again (PARSL_TORCH_WAITING_SPARES=0; the last version)",
          "retry": "retry on a spare through Parsl (a warm stage: its group ends with the node)",
          "elastic": "in place on the node left, 2 ranks (min_nodes=1)",
          "requeue": "full requeue (the stage fails, the workflow runs again in a new job)"}


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


def one(env: dict[str, str], tmp: Path, site: str, retries: int, name: str, min_nodes: int = 0,
        warm: bool = False) -> tuple[subprocess.Popen, Path]:
    run = tmp / name
    once = tmp / f"{name}.once"
    proc = subprocess.Popen([sys.executable, str(tmp / "wf.py"), site, str(run), str(retries), str(tmp / "train.yaml"),
                             str(min_nodes), "warm" if warm else "cold"],
                            env={**env, "PARSL_TORCH_FAULT": f"hang@2:{STOP_AT}:{once}"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    while not once.exists():
        time.sleep(0.05)
    return proc, run / "train" / "train.h5.progress.json"


def waiting_cost(env: dict[str, str], tmp: Path) -> str:
    """What the spare's waiting ranks cost a stage that loses no node: the workflow's wall time with them and
    without (``PARSL_TORCH_WAITING_SPARES=0``), the same train, fresh run directories, one after the other."""
    walls = {}
    for waiting in ("1", "0", "1", "0"):
        run = tmp / f"noloss-{waiting}-{len(walls)}"
        started = time.perf_counter()
        subprocess.run([sys.executable, str(tmp / "wf.py"), "nsspare", str(run), "0", str(tmp / "train.yaml"), "0",
                        "cold"], env={**env, "PARSL_TORCH_WAITING_SPARES": waiting}, check=True, capture_output=True)
        walls.setdefault(waiting, []).append(time.perf_counter() - started)
    kept, plain = min(walls["1"]), min(walls["0"])
    return (f"a stage that loses no node: {kept:.1f} s with the spare's ranks waiting, {plain:.1f} s without "
            f"({kept / plain:.2f}x; the best of two each; the spare's ranks import torch on a node of their own, "
            f"which here shares this machine's cores with the stage's)")


def snapshot_cost(steps: int = 100) -> str:
    """The state kept in node memory as a ratio of the step time (``bench_snapshot.py``'s two runs: without
    snapshots and with the interval measured, 2 ranks of a Transformer with AdamW, DDP), measured here."""
    import bench_snapshot

    args = argparse.Namespace(strategy="ddp", dim=512, layers=4, steps=steps)
    plain, kept = bench_snapshot.run("plain", args), bench_snapshot.run("measured", args)
    stalls = kept["taken"] * kept["stall_s"] / (steps * plain["mean_s"])
    return (f"the state kept in node memory: its stalls {stalls:.2%} of the step time ({kept['taken']} snapshots in "
            f"{steps} steps of {plain['mean_s'] * 1e3:.1f} ms, the last a {kept['stall_s'] * 1e3:.1f} ms stall); the "
            f"whole run {kept['mean_s'] / plain['mean_s']:.3f}x the plain one's step time (the writer's CPU too, and "
            f"this shared machine's noise; bench_snapshot.py, 2 ranks, DDP)")


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

            measured = {}
            for case, site, min_nodes, warm, extra in CASES:
                proc, progress = one({**env, **extra}, tmp, site, 1, case, min_nodes, warm)
                lost = time.perf_counter()
                cluster.lose_node("n2")
                seconds = _first_step_after(progress, STOP_AT + 1, lost)
                measured[case] = seconds, _resumed(proc)
                cluster.restart_node("n2")

            proc, progress = one(env, tmp, "nspbs", 0, "requeue")
            lost = time.perf_counter()
            cluster.lose_node("n2")
            proc.communicate(timeout=300)  # the stage fails, naming n2
            cluster.restart_node("n2")  # (the scheduler's replacement node)
            rerun = subprocess.Popen([sys.executable, str(tmp / "wf.py"), "nspbs", str(tmp / "requeue"), "0",
                                      str(tmp / "train.yaml"), "0", "cold"], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
            measured["requeue"] = _first_step_after(progress, STOP_AT + 1, lost), _resumed(rerun)
            waiting = waiting_cost(env, tmp)
    finally:
        cluster.down(quiet=True)
    requeue = measured["requeue"][0]
    print(f"node loss -> first training step after it (2 nodes x 2 ranks, NODE_TIMEOUT {args.node_timeout:g} s):\n"
          "| recovery | seconds | steps trained again | vs the requeue |\n|---|---|---|---|")
    for case, (seconds, resumed_from) in measured.items():
        print(f"| {LABELS[case]} | {seconds:.1f} | {STOP_AT - resumed_from} | {requeue / seconds:.2f}x faster |")
    print(f"all include the {args.node_timeout:g} s of silence in which the node is named lost; the "
          f"requeue's new job starts at once here (fake PBS), where a real queue adds its wait (ezpz publishes 9-11 s "
          f"per resume on Sunspot, after its own detection)")
    print(waiting)
    print(snapshot_cost())


if __name__ == "__main__":
    main()
