"""The node timeout's default, measured (``simnodes``): N simulated nodes (2,048 by default) send the shim's
heartbeat every 2 s to the real supervisor, for a while with no fault at all, at each node timeout asked
(the smallest the settings allow first), idle and with this machine's every core kept busy by other
processes (a loaded login or service node: the supervisor, the nodes' sender and the burners share the
cores). Any node called lost there is a false loss: a healthy node quarantined and its stage's ranks
started again. Printed per case: false losses, the supervisor's CPU, and what a real loss would take to
be named (the timeout, then up to the listener's 0.5 s look).

usage: python benchmarks/bench_node_timeout.py [--nodes 2048] [--timeouts 6,10] [--seconds 60]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import subprocess
import tempfile
import time
from pathlib import Path

import simnodes as sim

from parsl_torch.launch.listener import SCAN_S
from parsl_torch.launch.shim import HEARTBEAT_S


def _burn() -> None:
    while True:
        pass


def trial(n: int, timeout: float, seconds: float, loaded: bool, workdir: Path) -> dict:
    """One supervisor and ``n`` healthy nodes for ``seconds``: the nodes it called lost, its CPU per second."""
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(os.cpu_count() or 1)] if loaded else []
    sup = sim.Supervisor(n, 12, timeout, workdir)
    nodes = sim.SimNodes(sup.address, n, 12)
    try:
        nodes.start()
        for b in burners:
            b.start()
        since = time.time()
        with contextlib.suppress(subprocess.TimeoutExpired):  # (still running at the end: no node called lost)
            sup.wait(timeout=seconds)  # (it ends only if it called a node lost)
        until = time.time()
        lost = json.loads((workdir / "quarantine.json").read_text()).get(sim.JOB, {}) \
            if (workdir / "quarantine.json").exists() else {}
        ended = sup.first("exit")
        return {"false_losses": len(lost), "after_s": (ended["t_end"] - since) if ended else None,
                "cpu_per_s": sup.cpu_per_s(since + 2, until), "hello_failures": len(nodes.failed)}
    finally:
        for b in burners:
            b.kill()
        sup.stop()
        nodes.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=2048)
    p.add_argument("--timeouts", default="6,10")
    p.add_argument("--seconds", type=float, default=60.0)
    args = p.parse_args()
    print(f"{args.nodes} simulated nodes, a heartbeat every {HEARTBEAT_S:g} s each, {args.seconds:g} s per case, "
          f"no fault; {os.cpu_count()} core(s) here")
    print("| node timeout | load | false losses | supervisor CPU | a real loss named within |\n|---|---|---|---|---|")
    for timeout in map(float, args.timeouts.split(",")):
        for loaded in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                row = trial(args.nodes, timeout, args.seconds, loaded, Path(tmp))
            lost = f"{row['false_losses']} (the first after {row['after_s']:.1f} s)" if row["false_losses"] else "0"
            print(f"| {timeout:g} s | {'every core busy' if loaded else 'idle'} | {lost} | "
                  f"{row['cpu_per_s']:.3f} core | {timeout + SCAN_S:g} s |", flush=True)


if __name__ == "__main__":
    main()
