"""The smallest real stage, a check that an environment runs distributed torch: every rank
all-reduces its rank + 1 and a History is written; rank 0's summary is the stage's value
(``parsl-torch endpoint test`` runs it through an endpoint's engine)."""

from __future__ import annotations

from typing import Any

from ..core.ranks import get_world_size


def smoke(history: str) -> dict[str, Any]:
    """Runs on every rank of a stage (after ``setup_torch``); rank 0's return value is the stage's."""
    import torch
    import torch.distributed as dist

    from ..history.recorder import History

    total = torch.tensor([float(dist.get_rank() + 1 if dist.is_initialized() else 1)])
    if dist.is_initialized():
        dist.all_reduce(total)
    recorder = History("smoke", path=history)
    recorder.update({"sum": total.item()})
    path = recorder.finalize()
    return {"world_size": get_world_size(), "sum": total.item(), "history": str(path),
            "backend": dist.get_backend() if dist.is_initialized() else None}
