"""Checkpoints the built-in stages write and any strategy can read, with the model
config so an evaluation can refuse a checkpoint of another model.

* ``none`` / ``ddp``: one file, the full model and optimizer (every rank holds
  all of it anyway), written by rank 0 to a temporary name and renamed.
* ``fsdp`` / ``fsdp+tp``, and any ``parallel:`` layout that shards (pipeline stages included): sharded with ``torch.distributed.checkpoint`` (DCP):
  every rank writes its own shards, nothing is gathered to rank 0, and loading
  reshards to any world size and strategy (train on 4 ranks, evaluate on 1).
  ``path`` is then a link to ``<path>.steps/<step>/`` (the shards, DCP's
  ``.metadata`` and our ``meta.json``), swapped atomically once every rank has
  written: a save killed halfway leaves the link on the previous step.
  ``parsl-torch checkpoint export`` turns one into a single file.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, NoReturn

import torch

from ..common.diskspace import no_space, said_when_full
from ..core.dist import barrier
from ..core.ranks import get_rank, get_world_size
from . import faults

FORMAT = "parsl-torch/checkpoint-1"
SHARDED_FORMAT = "parsl-torch/dcp-1"
SHARDED_STRATEGIES = ("fsdp", "fsdp+tp")
META = "meta.json"


def save(path: str | os.PathLike, model, optimizer, step: int, model_config: dict[str, Any],
         call: str | None = None, strategy: str = "ddp", loss: float | None = None, stopped: bool = False) -> None:
    """Collective: every rank calls it. ``call``: the identity of the stage call that trains (only
    it may resume from here); ``strategy``: sharded (DCP) for fsdp and fsdp+tp, else one file;
    ``loss``: the mean loss of the last step saved (a stage resumed at its end reports it);
    ``stopped``: saved where a sweep cut the call (it ends there again when resumed)."""
    meta = {"format": FORMAT, "step": step, "model_config": model_config, "call": call, "strategy": strategy,
            "world_size": get_world_size(), "loss": loss, "stopped": stopped}
    if strategy in SHARDED_STRATEGIES or _sharded(model):
        _save_sharded(Path(path), model, optimizer, {**meta, "format": SHARDED_FORMAT})
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if get_rank() == 0:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        with said_when_full(path, tmp, _kept(path)):
            torch.save({**meta, "model": model_sd, "optimizer": optim_sd}, tmp)
        os.replace(tmp, path)  # (replaces a sharded checkpoint's link too)
        shutil.rmtree(path.with_name(path.name + ".steps"), ignore_errors=True)
    barrier()


def _kept(path: Path) -> str:
    """What a failed save leaves of the checkpoint before it (said with a full disk's error)."""
    return "the checkpoint saved before is kept: a rerun resumes from it" if path.exists() else \
        "no checkpoint of this call was saved before"


def _failed_sharded_save(path: Path, exc: BaseException, target: Path, collective: bool) -> NoReturn:
    """Raise ``exc``, or what says that ``path``'s file system is full. Where DCP raised on every rank
    (``collective``: its ``CheckpointException``), every rank first looks at the room, then rank 0 removes the
    step's shards, then all end; a rank's own failure (its peers still writing) leaves them to the next save."""
    full = no_space(path, exc, _kept(path))  # (before the shards are removed: that frees room)
    if collective:
        barrier()  # every rank has looked
        if get_rank() == 0:
            shutil.rmtree(target, ignore_errors=True)
        barrier()  # no rank ends before the room for the stage's record of why is made
    if full is None:
        raise exc
    raise full from exc


def _sharded(model) -> bool:
    """Whether the model's parameters are DTensors (any layout's FSDP2 or TP; a pipeline's stages):
    then no rank holds all of it, and every rank writes its own shards."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def _unwrapped(model, saved: dict[str, Any]) -> bool:
    """Whether the model's own state dict is the saved one's shape: no wrapper renamed its parameters
    (DDP's ``module.``) and none is sharded (no DTensor can exist before its module is imported)."""
    if "torch.distributed.tensor" in sys.modules and _sharded(model):
        return False
    return model.state_dict().keys() == saved.keys()


def _save_sharded(path: Path, model, optimizer, meta: dict[str, Any]) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    steps = path.with_name(path.name + ".steps")
    target = steps / f"{meta['step']:09d}"
    if path.is_dir() and not path.is_symlink():  # checked on every rank: all stop, nothing is touched
        raise ValueError(f"checkpoint path {path} is a directory that parsl-torch did not write: pick another "
                         f"output name (nothing there was touched)")
    if get_rank() == 0:
        linked = path.resolve() if path.is_symlink() else None
        for old in steps.iterdir() if steps.is_dir() else ():
            if old == target or old.resolve() != linked:  # saves killed or failed halfway: their room is
                shutil.rmtree(old, ignore_errors=True)    # needed now
        target.mkdir(parents=True)
    barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    try:
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(target))
    except (Exception, dcp.CheckpointException) as exc:  # (a BaseException, which DCP raises on every rank
        _failed_sharded_save(path, exc, target, isinstance(exc, dcp.CheckpointException))  # once one failed)
    faults.in_save(get_rank(), meta["step"])  # (the resilience tests' PARSL_TORCH_FAULT)
    barrier()  # every rank's shards are on disk
    if get_rank() == 0:
        (target / META).write_text(json.dumps(meta))
        link = path.with_name(path.name + ".link-tmp")
        link.unlink(missing_ok=True)
        link.symlink_to(os.path.relpath(target, path.parent))
        os.replace(link, path)  # (replaces a single-file checkpoint of an earlier run too)  # atomic: readers see the old step or the new one
        for old in steps.iterdir():
            if old != target:
                shutil.rmtree(old, ignore_errors=True)
    barrier()


def read(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's description (and, for one file, its tensors on CPU); ValueError if it is not
    one of ours. A sharded checkpoint's dict has ``format`` SHARDED_FORMAT and ``dir``."""
    path = Path(path)
    if path.is_dir():
        meta_file = path / META
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError):
            raise ValueError(f"{path} is not a parsl-torch checkpoint (no readable {META})") from None
        if meta.get("format") != SHARDED_FORMAT:
            raise ValueError(f"{path} is not a parsl-torch checkpoint")
        return {**meta, "dir": str(path.resolve())}
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - garbage makes torch.load fail in many ways (IndexError, KeyError, ...)
        raise ValueError(f"{path} is not a parsl-torch checkpoint: torch.load cannot read it "
                         f"({type(exc).__name__})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a parsl-torch checkpoint")
    return data


def restore(data: dict[str, Any], model, optimizer=None) -> None:
    """Load a checkpoint into a model wrapped any way, on every rank (a sharded one is resharded to
    this world size and strategy)."""
    if data["format"] != SHARDED_FORMAT and optimizer is None and _unwrapped(model, data["model"]):
        model.load_state_dict(data["model"])  # (an evaluation: no DCP, whose import costs a rank 1.4 s of CPU)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    optimizers = optimizer if optimizer is not None else ()
    if data["format"] == SHARDED_FORMAT:
        import torch.distributed.checkpoint as dcp

        model_sd, optim_sd = get_state_dict(model, optimizers)
        state = {"model": model_sd, **({"optimizer": optim_sd} if optimizer is not None else {})}
        dcp.load(state, checkpoint_id=data["dir"])
        set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state.get("optimizer", {}))
        return
    set_state_dict(model, optimizers, model_state_dict=data["model"],
                   optim_state_dict=data["optimizer"] if optimizer is not None else {},
                   options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))


def export(path: str | os.PathLike, out: str | os.PathLike) -> Path:
    """A sharded checkpoint as one file that every strategy reads (DCP's own conversion, then our
    header); written to a temporary name and renamed. No process group needed."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    meta = read(path)
    if meta["format"] != SHARDED_FORMAT:
        raise ValueError(f"{path} is already a single-file checkpoint")
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    with said_when_full(out, tmp, f"{path} is as it was"):
        dcp_to_torch_save(meta["dir"], tmp)
        tensors = torch.load(tmp, map_location="cpu", weights_only=True)
        meta = {k: v for k, v in meta.items() if k != "dir"}
        torch.save({**meta, "format": FORMAT, "model": tensors["model"], "optimizer": tensors.get("optimizer", {})},
                   tmp)
    os.replace(tmp, out)
    return out
