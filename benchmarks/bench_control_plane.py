"""The control plane at scale, with simulated nodes (``simnodes``): the real supervisor, listener, pool
scheduler, quarantine file and device claim, at N = 128, 512 and 2,048 nodes of R ranks.

Printed per N: the time from the nodes' start to the supervisor having every hello (all at once: a
storm), the supervisor's CPU per second of steady heartbeats (one per node every 2 s), the time from
a node's last heartbeat to the supervisor's outcome on it (node timeout 10 s; the goal is within the
timeout + 5 s), the pool scheduler's time per placement decision (10,000 queued one-node stages on
a block of N nodes, each placed as an earlier one ends), and every rank's device claim through one
TCPStore (connections timed apart from the claims). Then how each grows from the smallest N to
the largest, against N's own growth.

usage: python benchmarks/bench_control_plane.py [--nodes 128,512,2048] [--ranks 12] [--tasks 10000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import simnodes as sim

NODE_TIMEOUT_S = 10.0


def supervisor_figures(n: int, r: int, workdir: Path) -> dict:
    """Hellos, heartbeats' CPU and one silent node's detection, against one real supervisor."""
    sup = sim.Supervisor(n, r, NODE_TIMEOUT_S, workdir)
    nodes = sim.SimNodes(sup.address, n, r)
    try:
        t_start = time.time()
        nodes.start()
        deadline = time.time() + 120
        while not (seen := sup.first("all_hellos")) and time.time() < deadline:
            time.sleep(0.05)
        hellos_s = seen["all_hellos"] - t_start if seen else float("inf")
        time.sleep(8.0)  # steady heartbeats
        cpu = sup.cpu_per_s(time.time() - 6.5, time.time())
        victim = sim.node_names(n)[n // 2]
        nodes.silence(victim)
        code = sup.wait(timeout=NODE_TIMEOUT_S + 60)
        end = sup.first("exit")
        quarantined = victim in json.loads((workdir / "quarantine.json").read_text()).get(sim.JOB, {})
        return {"hellos_s": hellos_s, "hello_failures": len(nodes.failed), "cpu_per_s": cpu,
                "detected_s": end["t_end"] - nodes.last_beat[victim], "exit": code, "quarantined": quarantined}
    finally:
        sup.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="128,512,2048")
    p.add_argument("--ranks", type=int, default=12)
    p.add_argument("--tasks", type=int, default=10_000)
    args = p.parse_args()
    rows = {}
    for n in map(int, args.nodes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            row = supervisor_figures(n, args.ranks, Path(tmp) / "sup")
            decisions = sim.place(n, args.tasks, Path(tmp))
        # one store connection per rank, in one process: as many ranks per node as its open files allow
        claim_r = min(args.ranks, (sim.fd_limit() - 512) // n)
        row.update(place_median_us=statistics.median(decisions) * 1e6,
                   place_p99_us=sorted(decisions)[int(len(decisions) * 0.99)] * 1e6,
                   place_max_us=max(decisions) * 1e6, claim_ranks=n * claim_r, claim_r=claim_r,
                   **sim.claim_storm(n, claim_r))
        rows[n] = row
        print(f"N={n:5d} x R={args.ranks}: every hello in {row['hellos_s']:.2f} s ({row['hello_failures']} failed); "
              f"supervisor CPU {row['cpu_per_s']:.3f} core at {n / 2:.0f} heartbeats/s; silent node detected "
              f"{row['detected_s']:.1f} s after its last heartbeat (timeout {NODE_TIMEOUT_S:g} s, exit {row['exit']}, "
              f"quarantined: {row['quarantined']}); placement {row['place_median_us']:.0f} us median, "
              f"{row['place_p99_us']:.0f} us p99, {row['place_max_us']:.0f} us max per decision "
              f"({args.tasks} stages); claim of {row['claim_ranks']} ranks (R={claim_r}): connect "
              f"{row['connect_s']:.2f} s, claims {row['claim_s']:.2f} s ({row['n_errors']} errors; the store's server used "
              f"{row['store_cpu_s']:.1f} s of CPU in all)", flush=True)
    small, large = min(rows), max(rows)
    if small != large:
        print(f"growth from N={small} to N={large} ({large / small:.0f}x the nodes):")
        for key in ("hellos_s", "cpu_per_s", "detected_s", "place_median_us", "claim_s"):
            print(f"  {key}: {rows[large][key] / rows[small][key]:.2f}x")
    print(json.dumps({n: {k: v for k, v in row.items() if k != "errors"} for n, row in rows.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
