"""Activation checkpointing: a block's activations are recomputed in the backward pass instead of
kept from the forward one (``torch.utils.checkpoint``, non-reentrant), trading compute for memory.

``"full"`` checkpoints every repeated block, ``"selective"`` every second one and ``"selective:K"``
every K-th (the first block included), ``"none"`` (or None) none. Only the block's ``forward`` is
wrapped, in place: parameter names, and so state dicts and checkpoints, are those of the plain
model, and it composes with DDP, FSDP2 and TP as ``wrap_model`` applies them after.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:  # (the train stage's config checks its field where the workflow runs: no torch there)
    from torch import nn

#: the spellings ``activation_checkpointing`` takes
MODES = ("none", "full", "selective", "selective:K")


def checkpoint_every(value: str | None, field: str = "activation_checkpointing") -> int:
    """Every how many blocks one is checkpointed (0: none); a ConfigError naming ``field`` otherwise."""
    text = "none" if value is None else str(value).strip().lower()
    kind, _, every = text.partition(":")
    if text in ("none", "full", "selective"):
        return {"none": 0, "full": 1, "selective": 2}[text]
    if kind == "selective" and every.isdigit() and int(every) >= 1:
        return int(every)
    raise ConfigError(f"{field}: {value!r} is not one of {', '.join(MODES)} (K: every K-th block, a whole "
                      f"number >= 1)")


def checkpoint_blocks(blocks: Sequence[nn.Module], value: str | None) -> int:
    """Checkpoint the blocks ``value`` names (see the module docstring); how many were."""
    every = checkpoint_every(value)
    if not every:
        return 0
    if not blocks:
        raise ConfigError(f"activation_checkpointing: {value!r}: the model has no repeated blocks (an "
                          f"nn.ModuleList of layers) to recompute; use 'none'")
    chosen = [block for i, block in enumerate(blocks) if i % every == 0]
    for block in chosen:
        block.forward = functools.partial(_recomputed, block.forward)
    return len(chosen)


def _recomputed(forward: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import checkpoint

    return checkpoint(forward, *args, use_reentrant=False, **kwargs)
