"""Pipeline parallelism with PyTorch's own ``torch.distributed.pipelining``.

The model is split by its repeated blocks (the outermost ``nn.ModuleList``): stage ``s`` keeps a
run of blocks; the parts before the blocks (embeddings) stay on the first stage, those after
them (norm, head) on the last, and elsewhere they are set to ``None``, so the model's
``forward`` skips them, as the built-in models' do. A model may name them itself
(``pp_first``/``pp_last``, attribute names), or the caller passes a function
``split(model, stage, n_stages) -> nn.Module``. Every part keeps the plain model's parameter
names (the blocks keep their numbers), so a checkpoint written under one layout loads under
any other.

``PipelinedModel`` is what ``wrap_model`` returns for pp > 1: ``loss = model.step(inputs,
targets)`` runs one whole step's forward and backward over microbatches (GPipe, 1F1B or
interleaved 1F1B) and returns the step's mean loss on every rank (``model.evaluate`` the same,
forward only); its parameters and state dict are the union of this rank's stages', under the
plain model's names.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError
from .blocks import blocks_path
from .layout import SCHEDULES, Layout


def stage_blocks(n_blocks: int, layout: Layout) -> list[range]:
    """The blocks of every stage: from ``layout.pp_split``, else shared out evenly (the first
    stages take one more where they do not divide)."""
    n = layout.stages
    if layout.pp_split:
        starts = [0, *layout.pp_split, n_blocks]
    else:
        per, extra = divmod(n_blocks, n)
        starts = [s * per + min(s, extra) for s in range(n + 1)]
    return [range(starts[s], starts[s + 1]) for s in range(n)]


def split_model(model: nn.Module, stage: int, blocks: Sequence[range]) -> nn.Module:
    """A copy of ``model`` holding only stage ``stage``'s blocks, and its ends where it has them."""
    path = blocks_path(model)
    first, last = _ends(model, path)
    dropped = (first if stage > 0 else []) + (last if stage < len(blocks) - 1 else [])
    others = [b for i, b in enumerate(model.get_submodule(path)) if i not in blocks[stage]]
    # what the stage does not keep is never copied (the copy is of this stage's share of the model)
    part = copy.deepcopy(model, memo={id(x): None for x in [*others, *map(_attribute(model), dropped)]})
    kept = nn.ModuleList()
    full = part.get_submodule(path)
    kept._modules = {str(i): full[i] for i in blocks[stage]}  # (the blocks keep their numbers)
    parent_name, _, leaf = path.rpartition(".")
    setattr(part.get_submodule(parent_name), leaf, kept)
    for name in dropped:
        owner_name, _, attr = name.rpartition(".")
        setattr(part.get_submodule(owner_name), attr, None)
    return part


def _attribute(model: nn.Module) -> Callable[[str], Any]:
    def get(name: str) -> Any:
        owner_name, _, attr = name.rpartition(".")
        return getattr(model.get_submodule(owner_name), attr)

    return get


def _ends(model: nn.Module, path: str) -> tuple[list[str], list[str]]:
    """(what runs before the blocks, what runs after them), as dotted attribute names."""
    declared = getattr(model, "pp_first", None), getattr(model, "pp_last", None)
    if declared[0] is not None and declared[1] is not None:
        return list(declared[0]), list(declared[1])
    first: list[str] = []
    last: list[str] = []
    owner, prefix = model, ""
    for step in path.split("."):
        names = list(owner._modules)
        cut = names.index(step)
        first += [prefix + n for n in names[:cut] if owner._modules[n] is not None]
        last += [prefix + n for n in names[cut + 1:] if owner._modules[n] is not None]
        first += [prefix + n for n, p in owner._parameters.items() if p is not None]
        owner, prefix = owner._modules[step], f"{prefix}{step}."
    return first, last


class PipelinedModel(nn.Module):
    """This rank's pipeline stages, run a whole step at a time by ``step(inputs, targets)``.

    As a module it holds the stages' parameters under the plain model's names (what the
    optimizer and checkpoints see); ``parts`` are the stage modules the schedule runs."""

    def __init__(self, parts: list[nn.Module], stage_ids: list[int], layout: Layout, pp_group: Any,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], device: torch.device) -> None:
        from torch.distributed.pipelining import PipelineStage

        super().__init__()
        for part in parts:
            _mirror(self, part)
        n = layout.stages
        stages = [PipelineStage(part, s, n, device, group=pp_group) for part, s in zip(parts, stage_ids)]
        self.__dict__["parts"] = parts  # (not submodules: the mirror above holds their parameters)
        self.__dict__["_schedule"] = _schedule(layout, stages, loss_fn)
        self.__dict__["_pp"] = (pp_group, layout.pp, 0 in stage_ids, n - 1 in stage_ids, device, layout.microbatches)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one step over the microbatches (the gradients accumulate, as
        mean-loss gradients); the step's mean loss, the same on every rank. Collective."""
        return self._run(self._schedule.step, inputs, targets)

    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean loss of a batch, forward only (no gradients), the same on every rank. Collective."""
        run = getattr(self._schedule, "eval", None)
        if run is None:  # (checked on every rank alike: the same torch everywhere)
            raise ConfigError(f"PipelinedModel.evaluate needs torch >= 2.9 (its pipeline schedules' eval); this "
                              f"is torch {torch.__version__}: upgrade torch, or evaluate the checkpoint under a "
                              f"layout without pp (checkpoints move across layouts)")
        with torch.no_grad():
            return self._run(run, inputs, targets)

    def train(self, mode: bool = True) -> PipelinedModel:
        for part in self.parts:  # (the stages are not submodules: their dropout and norms follow here)
            part.train(mode)
        return super().train(mode)

    def _run(self, run: Callable, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        group, pp, first, last, device, microbatches = self._pp
        if len(inputs) % microbatches:  # (checked on every rank: a middle stage would wait forever)
            raise ConfigError(f"parallel.pp_microbatches: {microbatches} microbatches do not divide this rank's "
                              f"batch of {len(inputs)}: use a divisor, or a batch of a multiple of it per "
                              f"data-parallel rank")
        losses: list[torch.Tensor] = []
        # (contiguous: torch 2.8's stages refuse a sliced batch, x = tokens[:, :-1], on its strides)
        inputs, targets = inputs.contiguous(), targets.contiguous()
        run(*((inputs,) if first else ()), **({"target": targets, "losses": losses} if last else {}))
        loss = (torch.stack([x.detach().float() for x in losses]).mean() if last
                else torch.zeros((), device=device))
        dist.broadcast(loss, group=group, group_src=pp - 1)  # the last stage is on the pp group's last rank
        return loss

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a pipelined model runs whole steps: loss = model.step(inputs, targets), then "
                        "optimizer.step(); loss = model.evaluate(inputs, targets) without gradients")


def _mirror(root: nn.Module, part: nn.Module) -> None:
    """Register ``part``'s parameters and buffers in ``root`` under the same dotted names."""
    for kind, items in (("parameter", part.named_parameters()), ("buffer", part.named_buffers())):
        for name, tensor in items:
            owner_name, _, leaf = name.rpartition(".")
            owner = root
            for step in owner_name.split(".") if owner_name else ():
                if step not in owner._modules:
                    owner.add_module(step, nn.Module())
                owner = owner._modules[step]
            getattr(owner, f"register_{kind}")(leaf, tensor)


def _schedule(layout: Layout, stages: list[Any], loss_fn: Callable) -> Any:
    from torch.distributed import pipelining as pl

    cls = {"gpipe": pl.ScheduleGPipe, "1f1b": pl.Schedule1F1B, "interleaved-1f1b": pl.ScheduleInterleaved1F1B}
    chosen = stages if SCHEDULES[layout.pp_schedule] > 1 else stages[0]  # (interleaved: both of the rank's)
    return cls[layout.pp_schedule](chosen, layout.microbatches, loss_fn=loss_fn)
