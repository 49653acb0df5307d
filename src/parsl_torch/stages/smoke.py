"""``python -m parsl_torch.stages.smoke --history PATH``: the smallest real stage, a check that an
environment runs distributed torch: every rank all-reduces its rank + 1, a History is written,
rank 0 prints a JSON summary line (``parsl-torch endpoint test`` runs it through an endpoint's engine)."""

from __future__ import annotations

import argparse
import json
import sys

from ..core.dist import cleanup, setup_torch
from ..core.ranks import get_world_size
from ..history.recorder import History


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__.splitlines()[0])
    parser.add_argument("--history", required=True, help="where the History file goes")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    import torch
    import torch.distributed as dist

    rank = setup_torch()
    total = torch.tensor([float(rank + 1)])
    if dist.is_initialized():
        dist.all_reduce(total)
    history = History("smoke", path=args.history)
    history.update({"sum": total.item()})
    path = history.finalize()
    if rank == 0:
        print(json.dumps({"world_size": get_world_size(), "sum": total.item(), "history": str(path),
                          "backend": dist.get_backend() if dist.is_initialized() else None}), flush=True)
    cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
