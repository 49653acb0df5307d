"""A workflow whose distributed app lives in the script itself (shipped to the
ranks by value; what it uses from the script is found by name there, as
multiprocessing finds it), plus a script_app running an unmodified torchrun script.

usage: custom_app.py RUN_DIR
"""

import multiprocessing
import sys
from dataclasses import dataclass
from pathlib import Path

import parsl_torch as pt


@dataclass
class Point:
    x: float


def doubled(point):
    return Point(point.x * 2)


def in_pools():
    """A Pool pickles its function and values by name: ``__main__.doubled``, ``__main__.Point``."""
    done = []
    for method in ("fork", "spawn"):
        with multiprocessing.get_context(method).Pool(1) as pool:
            done += pool.map(doubled, [Point(len(done) + 1.0)])
    return [p.x for p in done]


@pt.distributed_app(ranks_per_node=2)
def rank_sum(offset: float, inputs=(), outputs=()):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(pt.get_rank()) + offset])
    dist.all_reduce(t)
    Path(outputs[0]).write_text(f"rank {pt.get_rank()} of {pt.get_world_size()}\n")
    # an output File arrives as a path (Parsl's .filepath too), without importing Parsl on the rank
    return {"sum": t.item(), "rank": pt.get_rank(), "filepath": outputs[0].filepath == str(outputs[0]),
            "parsl_on_ranks": "parsl" in sys.modules, "pools": in_pools() if pt.get_rank() == 0 else None,
            "input": Path(inputs[0]).read_text()}


torchrun_script = pt.script_app(Path(__file__).parent.parent / "ranks" / "torchrun_style.py", ranks_per_node=2)

with pt.workflow(site="local", run_dir=sys.argv[1]):
    Path("note.txt").write_text("read")
    f = rank_sum(10.0, inputs=["note.txt"], outputs=["sum.txt"])  # (a name where the workflow runs)
    s = torchrun_script()
    print("RESULT", f.result(), s.result(), Path(f.outputs[0].result().filepath).read_text().strip())
