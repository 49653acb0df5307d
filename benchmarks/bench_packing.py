"""A sweep of one-accelerator trials on one node that declares 4 accelerators (``launch.accelerators``,
the local site: no GPU needed), packed (4 at once, each on its own accelerator) against one at a
time (the same site without accelerators and ``local_slots: 1``: how a whole-node placement runs
them), measured in the same run. The trials sleep (``--hold`` seconds), so the 2 cores are not
the limit: the figure is the placement's. Goal: about 4x.

usage: python benchmarks/bench_packing.py [--trials 8] [--hold 10]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import bench_env

WORKFLOW = """
import json, sys, time, parsl_torch as pt

@pt.distributed_app(ranks_per_node=1)
def trial(i, hold):
    time.sleep(hold)
    return i

with pt.workflow(site=sys.argv[1], run_dir=sys.argv[2]):
    t0 = time.perf_counter()
    futures = [trial(i, float(sys.argv[4]), stage=f"t{i}") for i in range(int(sys.argv[3]))]
    [f.result() for f in futures]
    print(json.dumps({"wall": time.perf_counter() - t0}))
"""

SITES = {"packed": "name: packed\nscheduler: local\nlaunch:\n  accelerators: ['0', '1', '2', '3']\n",
         "serial": "name: serial\nscheduler: local\nlocal_slots: 1\n"}


def one(tmp: Path, site: str, trials: int, hold: float) -> float:
    out = subprocess.run([sys.executable, str(tmp / "wf.py"), site, str(tmp / site), str(trials), str(hold)],
                         env=bench_env(PARSL_TORCH_SITE_PATH=str(tmp / "sites")), capture_output=True, text=True,
                         timeout=1800)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])["wall"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--hold", type=float, default=10.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "wf.py").write_text(WORKFLOW)
        (tmp / "sites").mkdir()
        for name, text in SITES.items():
            (tmp / "sites" / f"{name}.yaml").write_text(text)
        serial = one(tmp, "serial", args.trials, args.hold)
        packed = one(tmp, "packed", args.trials, args.hold)
    print(f"{args.trials} one-accelerator trials of {args.hold:g} s on one node with 4 accelerators (local site), "
          f"wall seconds:\n| one at a time | packed | speed-up |\n|---|---|---|\n"
          f"| {serial:.1f} | {packed:.1f} | {serial / packed:.2f}x |")


if __name__ == "__main__":
    main()
