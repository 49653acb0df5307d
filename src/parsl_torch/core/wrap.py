"""wrap_model: one call from a plain module to DDP, FSDP2, FSDP2 x TP, or any ``Layout``
(``core.parallelize``: pipeline and context parallel, HSDP, their compositions).

Each strategy is a small function. Everything that can be wrong (strategy
name, dtype, TP size, plan) is checked first, identically on every rank, so a
mistake fails all ranks before any collective starts.

``precision`` (fp32 | bf16 | fp16 | float8; ``dtype`` is its older name) is honoured at every world size
and strategy (``core.precision``): autocast around the forward for none/ddp and on one rank,
FSDP2's MixedPrecisionPolicy (fp32 reduction) for fsdp and fsdp+tp; never dropped.

* ``ddp``: DistributedDataParallel (``settle_buckets`` before a resumed run's first step: bitwise resumes).
* ``fsdp``: FSDP2 ``fully_shard`` on every repeated block (each element of the
  model's ``nn.ModuleList``\\ s), then on the root.
* ``fsdp+tp``: a 2-D DeviceMesh (dp, tp), tp ranks adjacent (inside a node);
  the tensor-parallel plan is applied to every block, then FSDP2 over dp.
  Ranks of one tp group must be fed the same batch: see ``data_parallel_coords``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .blocks import find_blocks
from .device import get_torch_device, get_torch_device_type
from .float8 import to_float8
from .layout import Layout, from_strategy
from .parallelize import fsdp_shard, parallelize
from .precision import autocast_forward, check_precision, dtype_of, normalize_precision
from .ranks import get_rank, get_world_size
from .recompute import checkpoint_blocks
from .strategy import normalize_strategy
from .topology import env_topology

_STYLES = ("colwise", "rowwise")


def wrap_model(model: nn.Module, strategy: str | None = None, *, use_fsdp: bool | None = None,
               precision: str | torch.dtype | None = None, dtype: str | torch.dtype | None = None,
               tp_size: int | None = None, tp_plan: Mapping[str, Any] | None = None,
               activation_checkpointing: str | None = None, layout: Layout | None = None,
               loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
               pipeline_split: Callable[[nn.Module, int, int], nn.Module] | None = None) -> nn.Module:
    """Wrap ``model`` (already on this rank's device) for data/tensor parallelism.

    ``strategy``: none | ddp | fsdp | fsdp+tp (default ddp). ``use_fsdp``: the
    ezpz spelling (True: fsdp, False: ddp). ``precision``: fp32 | bf16 | fp16 | float8
    (``dtype``: its older name; None: the model as it is; float8: ``core.float8``), at every world size and
    strategy: autocast for none/ddp (fp16 also needs ``core.precision.grad_scaler``),
    FSDP2 mixed precision with fp32 gradient reduction for fsdp/fsdp+tp.
    ``tp_size``/``tp_plan``: for fsdp+tp; the plan maps module names inside a
    block to "colwise" or "rowwise" (or a torch ParallelStyle) and defaults to
    ``model.tp_plan``. With one rank nothing is sharded (the precision still applies).
    ``activation_checkpointing``: none | full | selective | selective:K (``core.recompute``): the
    blocks whose activations are recomputed in the backward pass, at every world size and strategy.
    ``layout``: every parallel dimension at once (``core.layout.Layout``: dp_replicate, dp_shard,
    tp, pp, cp, the pipeline's schedule), instead of ``strategy``/``tp_size``; with pp > 1 the
    result is a ``PipelinedModel`` (``loss = model.step(inputs, targets)``), which needs
    ``loss_fn(output, target)`` and takes ``pipeline_split(model, stage, n_stages)`` for a model
    the default split (by its blocks) does not fit.
    """
    precision = _resolve_precision(precision, dtype)
    if layout is not None:
        return _wrap_layout(model, layout, strategy, use_fsdp, tp_size, tp_plan, precision,
                            activation_checkpointing, loss_fn, pipeline_split)
    if loss_fn is not None or pipeline_split is not None:
        raise ConfigError("loss_fn/pipeline_split apply to a pipelined layout: pass layout=Layout(pp=...)")
    strategy = _resolve_strategy(strategy, use_fsdp)
    world = get_world_size()
    if strategy == "fsdp+tp":
        plan = _check_tp(model, world, tp_size, tp_plan)
    elif tp_size not in (None, 1) or tp_plan is not None:
        raise ConfigError(f"tp_size/tp_plan apply to strategy 'fsdp+tp', not {strategy!r}")
    device_type = get_torch_device_type()
    _in_precision(model, precision, device_type, tp_size or 1 if strategy == "fsdp+tp" else 1)
    checkpoint_blocks(find_blocks(model), activation_checkpointing)  # (checks its value first, on every rank)
    if world == 1 or strategy == "none":
        return autocast_forward(model, precision, device_type) if precision else model
    if strategy == "ddp":
        return autocast_forward(_ddp(model), precision, device_type) if precision else _ddp(model)
    param_dtype = dtype_of(precision) if precision not in (None, "fp32") else None
    if strategy == "fsdp":
        return fsdp_shard(model, find_blocks(model), None, param_dtype)
    return _fsdp_tp(model, world, tp_size, plan, param_dtype)  # type: ignore[arg-type]


def _wrap_layout(model: nn.Module, layout: Layout, strategy: str | None, use_fsdp: bool | None,
                 tp_size: int | None, tp_plan: Mapping[str, Any] | None, precision: str | None,
                 activation_checkpointing: str | None, loss_fn: Any, split: Any) -> nn.Module:
    """``wrap_model`` for a ``Layout``: its strategies' layouts go the strategies' way, the rest to
    ``core.parallelize``."""
    if strategy is not None or use_fsdp is not None or tp_size is not None:
        raise ConfigError("layout= replaces strategy/use_fsdp/tp_size: pass the sizes in the layout alone")
    world = get_world_size()
    sizes = layout.check(world, env_topology().local_world_size, None)
    if world == 1 and layout.pp == 1:
        _in_precision(model, precision, get_torch_device_type())
        checkpoint_blocks(find_blocks(model), activation_checkpointing)
        return autocast_forward(model, precision, get_torch_device_type()) if precision else model
    for name in ("ddp", "fsdp", "fsdp+tp"):
        if layout.pp == layout.cp == 1 and from_strategy(name, world, layout.tp).sizes(world) == sizes \
                and loss_fn is None and split is None:
            return wrap_model(model, name, precision=precision, tp_size=layout.tp if layout.tp > 1 else None,
                              tp_plan=tp_plan, activation_checkpointing=activation_checkpointing)
    plan = _check_tp(model, world, layout.tp, tp_plan) if layout.tp > 1 else None
    _in_precision(model, precision, get_torch_device_type(), layout.tp)
    param_dtype = dtype_of(precision) if precision not in (None, "fp32") else None
    return parallelize(model, layout, tp_plan=plan, param_dtype=param_dtype,
                       activation_checkpointing=activation_checkpointing, loss_fn=loss_fn, split=split)


def _in_precision(model: nn.Module, precision: str | None, device_type: str, tp: int = 1) -> None:
    """Refused where the device cannot run ``precision``; for float8, its linear layers swapped first (before
    FSDP2 and compile, as torchtitan does)."""
    if precision is None:
        return
    if precision == "float8" and tp > 1:  # (torchtitan shards float8 layers with float8 styles of its own)
        raise ConfigError("precision='float8' with tensor parallelism is not supported: use fsdp (or a layout "
                          "without tp), or precision 'bf16'")
    check_precision(precision, device_type)
    if precision == "float8":
        to_float8(model)


def _resolve_strategy(strategy: str | None, use_fsdp: bool | None) -> str:
    if strategy is None:
        return "ddp" if use_fsdp is None or not use_fsdp else "fsdp"
    name = normalize_strategy(strategy)
    if use_fsdp is not None and use_fsdp != name.startswith("fsdp"):
        raise ConfigError(f"use_fsdp={use_fsdp} contradicts strategy={strategy!r}: pass only one")
    return name


def _resolve_precision(precision: Any, dtype: Any) -> str | None:
    """``precision``, or ``dtype`` (its older name); both given must agree."""
    given = normalize_precision(precision)
    old = normalize_precision(dtype, "dtype")
    if given is not None and old is not None and given != old:
        raise ConfigError(f"precision={precision!r} and dtype={dtype!r} disagree: pass precision alone")
    return given or old


def data_parallel_coords(tp_size: int = 1) -> tuple[int, int]:
    """(dp_rank, dp_size) of this rank: which data shard it reads, out of how many."""
    return get_rank() // tp_size, get_world_size() // tp_size


def _ddp(model: nn.Module) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    device = get_torch_device()
    return DistributedDataParallel(model, device_ids=[device] if device.type in ("cuda", "xpu") else None)


def settle_buckets(model: nn.Module, backward: Callable[[], Any]) -> bool:
    """Collective, before a resumed run's first step: DDP's gradient buckets laid out as the run it continues
    had them. A new DDP sums its first step's gradients in one bucket and lays them out by the order they
    became ready only after it, so a resumed run's first step would sum them in another layout from the
    uninterrupted run's (another rounding with three ranks or more, and every later step with it).
    ``backward()``: one forward and backward of the training's own, on any batch; its gradients are dropped
    and the RNG left as it was, so the resumed steps are the uninterrupted run's, bitwise. Anything but a DDP
    that will lay its buckets out (FSDP, one process, ``find_unused_parameters``): nothing to do. Whether it
    ran ``backward``."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel) or (model.find_unused_parameters and not model.static_graph):
        return False
    device = next(model.parameters()).device
    on_device = [] if device.type == "cpu" else [device.index if device.index is not None else 0]
    with torch.random.fork_rng(devices=on_device, device_type=device.type if on_device else None):
        backward()
    model.zero_grad(set_to_none=True)
    return True


def _check_tp(model: nn.Module, world: int, tp_size: int | None,
              tp_plan: Mapping[str, Any] | None) -> dict[str, Any]:
    """The tensor-parallel plan as ParallelStyles, after checking it fits the model."""
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
        raise ConfigError(f"strategy 'fsdp+tp' needs tp_size, a positive int (got {tp_size!r})")
    if world % tp_size:
        raise ConfigError(
            f"tp_size={tp_size} does not divide the world size {world}: "
            f"use a divisor of {world} or launch a multiple of {tp_size} ranks"
        )
    plan = tp_plan if tp_plan is not None else getattr(model, "tp_plan", None)
    blocks = find_blocks(model)
    if not plan:
        raise ConfigError(
            f"strategy 'fsdp+tp' needs a tensor-parallel plan for {type(model).__name__}: pass "
            f"tp_plan={{'fc1': 'colwise', 'fc2': 'rowwise'}} (module names inside each block)"
            + ("" if blocks else "; the model has no repeated blocks (nn.ModuleList), so names are relative to the model")
        )
    styles: dict[str, Any] = {}
    for name, style in plan.items():
        if isinstance(style, ParallelStyle):
            styles[name] = style
        elif style in _STYLES:
            styles[name] = ColwiseParallel() if style == "colwise" else RowwiseParallel()
        else:
            raise ConfigError(f"tp_plan[{name!r}]={style!r}: use 'colwise', 'rowwise' or a ParallelStyle")
    for i, block in enumerate(blocks or [model]):
        where = f"block {i}" if blocks else type(model).__name__
        for name in plan:
            try:
                layer = block.get_submodule(name)
            except AttributeError:
                raise ConfigError(f"tp_plan names {name!r}, which {where} does not have") from None
            if isinstance(layer, nn.Linear) and isinstance(styles[name], (ColwiseParallel, RowwiseParallel)):
                n = layer.out_features if isinstance(styles[name], ColwiseParallel) else layer.in_features
                if n % tp_size:
                    raise ConfigError(f"{where}: {name} has {n} features, not divisible by tp_size={tp_size}")
        for mod in block.modules():
            heads = getattr(mod, "n_heads", None)
            if isinstance(heads, int) and heads % tp_size:
                raise ConfigError(f"{where}: {heads} attention heads are not divisible by tp_size={tp_size}")
    return styles


def _fsdp_tp(model: nn.Module, world: int, tp_size: int, plan: dict[str, Any],
             param_dtype: torch.dtype | None) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(get_torch_device_type(), (world // tp_size, tp_size),
                            mesh_dim_names=("dp", "tp"))
    for block in find_blocks(model) or [model]:
        parallelize_module(block, mesh["tp"], plan)
    return fsdp_shard(model, find_blocks(model), mesh["dp"], param_dtype)
