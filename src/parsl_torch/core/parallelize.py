"""A model laid out on the device mesh of a ``Layout``: pipeline split, tensor parallel,
activation checkpointing, then FSDP2 over the data dimensions (HSDP when replicas are asked
for), in torchtitan's order. ``wrap_model`` sends here every layout its strategies do not name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError
from .blocks import blocks_path, find_blocks
from .device import get_torch_device, get_torch_device_type
from .layout import DIMS, Layout
from .pipeline import PipelinedModel, split_model, stage_blocks
from .ranks import get_world_size
from .recompute import checkpoint_blocks, checkpoint_every
from .topology import env_topology


def layout_mesh(layout: Layout) -> Any:
    """The DeviceMesh of every dimension, with the flattened ones the wrapping uses: ``dp``
    (which batch a rank reads), ``dp_shard_cp`` (what FSDP shards over)."""
    from torch.distributed.device_mesh import init_device_mesh

    sizes = layout.sizes(get_world_size())
    mesh = init_device_mesh(get_torch_device_type(), tuple(sizes[d] for d in DIMS), mesh_dim_names=DIMS)
    mesh[("dp_replicate", "dp_shard")]._flatten("dp")
    mesh[("dp_shard", "cp")]._flatten("dp_shard_cp")
    return mesh


def parallelize(model: nn.Module, layout: Layout, *, tp_plan: dict[str, Any] | None,
                param_dtype: torch.dtype | None, activation_checkpointing: str | None,
                loss_fn: Callable | None, split: Callable | None) -> nn.Module:
    """``model`` laid out by ``layout`` (checked first, on every rank); a ``PipelinedModel`` for pp > 1."""
    world = get_world_size()
    n_blocks = len(find_blocks(model))
    layout.check(world, env_topology().local_world_size, n_blocks if split is None else None)
    checkpoint_every(activation_checkpointing)
    if layout.cp > 1:
        check_context_parallel(model)
    if layout.pp > 1:
        if loss_fn is None:
            raise ConfigError("parallel.pp: a pipelined model computes the loss on its last stage: pass "
                              "wrap_model(..., loss_fn=lambda output, target: ...)")
        if split is None:
            blocks_path(model)  # (a model without blocks is refused before any collective)
    mesh = layout_mesh(layout)
    pp_rank = mesh["pp"].get_local_rank()
    stage_ids = [pp_rank + k * layout.pp for k in range(layout.stages // layout.pp)]
    device = get_torch_device()
    # (a pipeline's model may be built on the CPU: only this rank's stages reach its device)
    parts = [_stage(model, s, layout, n_blocks, split).to(device) for s in stage_ids] if layout.pp > 1 else [model]
    dp_mesh = mesh[("dp_replicate", "dp_shard_cp")] if layout.dp_replicate > 1 else mesh["dp_shard_cp"]
    for part in parts:
        blocks = find_blocks(part)
        if layout.tp > 1:
            from torch.distributed.tensor.parallel import parallelize_module

            for block in blocks or [part]:
                parallelize_module(block, mesh["tp"], tp_plan)
        checkpoint_blocks(blocks, activation_checkpointing)
        # (a pipeline stage's root stays unsharded after its forward: the backward comes soon after)
        fsdp_shard(part, blocks, dp_mesh, param_dtype, reshard_root=layout.pp == 1)
    if layout.pp == 1:
        parts[0].layout_mesh = mesh  # (sequence_shards finds the context-parallel group there)
        return parts[0]
    return PipelinedModel(parts, stage_ids, layout, mesh["pp"].get_group(), loss_fn, device)


def _stage(model: nn.Module, stage: int, layout: Layout, n_blocks: int, split: Callable | None) -> nn.Module:
    if split is None:
        return split_model(model, stage, stage_blocks(n_blocks, layout))
    part = split(model, stage, layout.stages)
    if not isinstance(part, nn.Module):
        raise ConfigError(f"the pipeline split function returned {type(part).__name__} for stage {stage}, "
                          f"not an nn.Module")
    return part


def fsdp_shard(root: nn.Module, blocks: list[nn.Module], mesh: Any, param_dtype: torch.dtype | None,
               reshard_root: bool = True) -> nn.Module:
    """FSDP2 on each block, then on the root (which takes the parameters the blocks leave).

    Over gloo the gradients are summed, then divided: gloo's reduce-scatter in torch 2.8 takes
    ReduceOp.AVG and silently sums (measured), so FSDP's default leaves them world-size times too large."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh}
    if param_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in blocks:
        fully_shard(block, **kwargs)
    sharded = fully_shard(root, reshard_after_forward=reshard_root, **kwargs)
    if dist.get_backend() == "gloo":
        for module in (*blocks, sharded):
            module.set_force_sum_reduction_for_comms(True)
    return sharded


def check_context_parallel(model: nn.Module) -> None:
    """cp > 1 needs a model whose attention is torch's SDPA and takes position ids
    (``context_parallel = True``, as the built-in Transformer), on a device torch's ring attention runs on."""
    if not getattr(model, "context_parallel", False):
        raise ConfigError(f"parallel.cp: {type(model).__name__} does not declare context-parallel attention "
                          f"(context_parallel = True: its attention calls F.scaled_dot_product_attention and "
                          f"its forward takes positions=): use cp: 1")
    device = get_torch_device_type()
    if device not in ("cuda",):
        raise ConfigError(f"parallel.cp: torch's context-parallel attention runs on CUDA GPUs only (on {device} "
                          f"its SDPA kernel has no sharding rule, torch {torch.__version__}): use cp: 1 here")


@contextlib.contextmanager
def sequence_shards(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> Iterator[torch.Tensor | None]:
    """Under cp > 1 (a model from ``parallelize``): inside, ``inputs`` and ``targets`` (batch, sequence)
    hold this rank's shards of the sequence, in place, SDPA is torch's ring attention, and the
    positions of those shards are yielded (the model's ``positions=``); else None, at no cost.
    Run forward and backward inside."""
    mesh = getattr(model, "layout_mesh", None)
    if mesh is None or mesh["cp"].size() == 1:
        yield None
        return
    from torch.distributed.tensor.experimental import context_parallel

    positions = torch.arange(inputs.shape[1], device=inputs.device).repeat(inputs.shape[0], 1)
    buffers = [inputs, targets, positions]
    with context_parallel(mesh["cp"], buffers=buffers, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(buffers)):
        yield positions
