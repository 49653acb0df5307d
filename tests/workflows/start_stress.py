"""Many short stages, each of which only starts: 2 and 4 ranks alternating, two at a time on the
local site, every KILL_EVERY-th one killing its own ranks (os.killpg) so that the next stage
starts right after a killed one. A stage whose ranks do no collective and leave at once is the
shape that used to fail its slower ranks at start ("Gloo connectFullMesh failed ... Connection
closed by peer"). Prints one JSON line: stages started, killed, failed, and each failure's text.

usage: start_stress.py RUN_DIR STAGES
"""

import json
import os
import signal
import sys
import time

import parsl_torch as pt

KILL_EVERY = 7


@pt.distributed_app
def starts(i: int, kill: bool):
    if kill and pt.get_rank() == 1:  # the rank's launcher and its peers die with it
        os.killpg(os.getpgrp(), signal.SIGKILL)
    return {"stage": i, "world_size": pt.get_world_size()}


if __name__ == "__main__":
    run_dir, count = sys.argv[1], int(sys.argv[2])
    t0 = time.perf_counter()
    failed: list[str] = []
    with pt.workflow(site="local", run_dir=run_dir, fresh=True):
        calls = []
        for i in range(count):
            kill, ranks = i % KILL_EVERY == KILL_EVERY - 1, 2 if i % 2 == 0 else 4
            calls.append((i, kill, ranks, starts(i, kill, ranks_per_node=ranks, stage=f"start{i}")))
        for i, kill, ranks, future in calls:
            try:
                value = future.result()
            except pt.StageError as exc:
                if not kill:
                    failed.append(f"start{i} ({ranks} ranks): {exc}"[:2000])
                continue
            if kill or value != {"stage": i, "world_size": ranks}:
                failed.append(f"start{i} ({ranks} ranks) returned {value!r}")
    print(json.dumps({"stages": count, "killed": sum(c[1] for c in calls), "failed": failed,
                      "seconds": round(time.perf_counter() - t0, 1)}))
