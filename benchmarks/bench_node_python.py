"""On the multi-node test cluster (tests/cluster, root): Python from node-local storage
(site ``node_local_python``) against the shared environment, in the same run. The copy's cost
(pack once per environment change, then per block: ``sbcast`` and an unpack on every node), and
the start-up of a 2-node x 1-rank stage (``import torch`` and the process group) from each. All
the nodes here share one disk, so no import is faster: the published figures at scale are in the
README.

usage: sudo python benchmarks/bench_node_python.py
"""

from __future__ import annotations

import json
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
def start():
    import torch, torch.distributed as dist
    t = torch.ones(1); dist.all_reduce(t)
    return t.item()

t0 = time.perf_counter()
with pt.workflow(site=sys.argv[1], run_dir=sys.argv[2]):
    start(stage="first").result()  # the block starts (and stages Python, with the setting)
    first = time.perf_counter() - t0
    times = []
    for i in range(4):
        t1 = time.perf_counter()
        start(stage=f"s{i}").result()
        times.append(time.perf_counter() - t1)
print(json.dumps({"first": first, "times": times}))
"""


def run(env: dict[str, str], tmp: Path, site: str) -> dict:
    out = subprocess.run([sys.executable, str(tmp / "wf.py"), site, str(tmp / site)], env=env,
                         capture_output=True, text=True, timeout=1200)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from parsl_torch.launch import nodepython

    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        archive = nodepython.pack(tmp / "cache")
        packed, size = time.perf_counter() - t0, archive.stat().st_size / 2**30
        t0 = time.perf_counter()
        nodepython.unpack(archive, tmp / "unpacked")
        unpacked = time.perf_counter() - t0
        cluster.up(3)
        try:
            site_variant(tmp / "sites", "nsslurm", "nslocal", node_local_python=str(cluster.NODE_LOCAL))
            env = cluster_env(cluster, tmp / "sites", PARSL_TORCH_CACHE_DIR=str(tmp / "cache"))
            (tmp / "wf.py").write_text(WORKFLOW)
            shared = run(env, tmp, "nsslurm")
            local = run(env, tmp, "nslocal")
        finally:
            cluster.down(quiet=True)
    s, n = statistics.median(shared["times"]), statistics.median(local["times"])
    print(f"Python from node-local storage on the test cluster ({size:.2f} GiB environment):\n"
          "| | shared venv | node-local copy |\n|---|---|---|\n"
          f"| workflow start to the first 2-node stage's end (s) | {shared['first']:.1f} | {local['first']:.1f} |\n"
          f"| a 2-node stage after it, median (s) | {s:.2f} | {n:.2f} |\n"
          f"-> pack once per environment change {packed:.1f} s, unpack per node {unpacked:.1f} s; the first stage "
          f"pays the block's copy ({local['first'] - shared['first']:+.1f} s here); later stages {n / s:.2f}x "
          f"(one disk here: the gain is at scale, where imports from the shared file system take minutes)")


if __name__ == "__main__":
    main()
