"""The built-in stages' model: built from a ``ModelConfig``, and a checkpoint
of another model refused before it is loaded (shared by train and evaluate)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..errors import ConfigError
from .config import ModelConfig


def build_model(cfg: ModelConfig) -> Any:
    """The package's Transformer or token MLP for ``cfg`` (imports torch)."""
    from ..core.models import TokenMLP, Transformer

    if cfg.kind == "mlp":
        return TokenMLP(vocab_size=cfg.vocab_size, dim=cfg.dim, n_layers=cfg.n_layers)
    return Transformer(vocab_size=cfg.vocab_size, dim=cfg.dim, n_heads=cfg.n_heads, n_layers=cfg.n_layers,
                       max_seq_len=cfg.seq_len)


def check_checkpoint_model(ckpt: dict[str, Any], model: ModelConfig, path: Any, stage: str) -> None:
    """A checkpoint of another model is refused before it is loaded into this one."""
    theirs, ours = ckpt.get("model_config", {}), asdict(model)
    for key, value in ours.items():
        if theirs.get(key) != value:
            raise ConfigError(f"stage {stage!r}: model.{key}={value!r} but checkpoint {path} holds a model with "
                              f"model.{key}={theirs.get(key)!r}: use the model settings it was trained with")
