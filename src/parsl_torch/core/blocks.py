"""A model's repeated blocks (the elements of its outermost ``nn.ModuleList``): what FSDP2 shards
one by one, activation checkpointing recomputes and the pipeline splits into stages."""

from __future__ import annotations

from torch import nn

from ..errors import ConfigError


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks: elements with parameters of the outermost ModuleLists."""
    blocks: list[tuple[str, nn.Module]] = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and not any(name.startswith(f"{b}.") for b, _ in blocks):
            blocks += [(f"{name}.{i}", m) for i, m in enumerate(mod)
                       if next(m.parameters(), None) is not None]
    return [m for _, m in blocks]


def blocks_path(model: nn.Module) -> str:
    """The dotted name of the model's outermost ModuleList of blocks (a ConfigError without one)."""
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and any(next(m.parameters(), None) is not None for m in mod):
            return name
    raise ConfigError(f"parallel.pp: {type(model).__name__} has no repeated blocks (an nn.ModuleList of layers) "
                      f"to split into pipeline stages: use pp: 1, or pass a split function")
