"""Checkpoints that any strategy can read: full (unsharded) model and
optimizer state, gathered to rank 0 and written atomically, with the model
config so an evaluation can refuse a checkpoint of another model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

FORMAT = "parsl-torch/checkpoint-1"


def save(path: str | os.PathLike, model, optimizer, step: int, model_config: dict[str, Any],
         call: str | None = None) -> None:
    """Collective: every rank calls it; rank 0 writes ``path`` (tmp file, then rename).
    ``call``: the identity of the stage call that trains (only it may resume from here)."""
    model_sd, optim_sd = get_state_dict(model, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"format": FORMAT, "step": step, "model_config": model_config, "call": call,
                    "model": model_sd, "optimizer": optim_sd}, tmp)
        os.replace(tmp, path)
    dist.barrier()


def read(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's contents (on CPU); ValueError if it is not one of ours."""
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a parsl-torch checkpoint")
    return data


def restore(data: dict[str, Any], model, optimizer=None) -> None:
    """Load a full checkpoint into a (possibly sharded) model on every rank."""
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
    if optimizer is None:
        set_state_dict(model, optimizers=(), model_state_dict=data["model"], optim_state_dict={}, options=options)
    else:
        set_state_dict(model, optimizer, model_state_dict=data["model"], optim_state_dict=data["optimizer"],
                       options=options)
