"""On the multi-node test cluster (tests/cluster, root): what the pre-flight check
(``mpi.preflight``) adds to a 2-node stage, and what it saves when a node cannot be reached.

Healthy nodes: 6 short 2-node x 1-rank stages in a row on a 2-node PBS block, without and with
the check, in the same run; the figure is the median stage time with it over without. A node
whose link is down: a 3-node block, the 2-node stage is handed the dead node; with the check
(5 s) the stage runs on the other two nodes; without it the stage fails (here MPICH's mpiexec
ends it when it loses its daemon on the dead node; ranks that reach no one wait until the
collective timeout, PARSL_TORCH_TIMEOUT: 60 s here, 600 s by default) and costs a retry.

usage: sudo python benchmarks/bench_preflight.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import cluster_env, site_variant

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "cluster"))
import cluster  # noqa: E402  (the test harness)

WORKFLOW = """
import json, sys, time, parsl_torch as pt

@pt.distributed_app(num_nodes=2, ranks_per_node=1)
def step():
    import torch, torch.distributed as dist
    t = torch.ones(1); dist.all_reduce(t)
    return t.item()

times, error = [], ""
with pt.workflow(site=sys.argv[1], run_dir=sys.argv[2], nodes=int(sys.argv[4])):
    for i in range(int(sys.argv[3])):
        t0 = time.perf_counter()
        try:
            step(stage=f"s{i}").result()
        except Exception as exc:
            error = str(exc).splitlines()[0]
        times.append(time.perf_counter() - t0)
print(json.dumps({"times": times, "error": error}))
"""


def run(env: dict[str, str], tmp: Path, site: str, name: str, stages: int, nodes: int) -> dict:
    import json

    out = subprocess.run([sys.executable, str(tmp / "wf.py"), site, str(tmp / name), str(stages), str(nodes)],
                         env=env, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    cluster.up(3)
    try:
        with tempfile.TemporaryDirectory(dir="/tmp") as d:
            tmp = Path(d)
            site_variant(tmp / "sites", "nspbs", "nscheck", mpi={"preflight": 5})
            env = cluster_env(cluster, tmp / "sites", PARSL_TORCH_TIMEOUT="60")
            (tmp / "wf.py").write_text(WORKFLOW)
            # the first stage of each workflow waits for its block: the others are compared
            plain = statistics.median(run(env, tmp, "nspbs", "plain", 6, 2)["times"][1:])
            checked = statistics.median(run(env, tmp, "nscheck", "checked", 6, 2)["times"][1:])
            cluster.lose_node("n2")
            t0 = time.perf_counter()
            with_check = run(env, tmp, "nscheck", "dead-checked", 1, 3)
            with_check_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            without = run(env, tmp, "nspbs", "dead-plain", 1, 3)
            without_s = time.perf_counter() - t0
    finally:
        cluster.down(quiet=True)
    print("pre-flight check (mpi.preflight: 5) on the test cluster, 2-node x 1-rank stages:\n"
          "| case | without the check | with it |\n|---|---|---|\n"
          f"| healthy nodes: median stage time (s) | {plain:.2f} | {checked:.2f} |\n"
          f"| a node's link down: the workflow (s), its result | {without_s:.1f}, "
          f"{without['error'][:60] or 'ok'} | {with_check_s:.1f}, {with_check['error'][:60] or 'ok'} |\n"
          f"-> the check costs {checked - plain:+.2f} s per multi-node stage ({checked / plain:.2f}x of a "
          f"healthy stage here); with a dead node the stage runs instead of failing")


if __name__ == "__main__":
    main()
