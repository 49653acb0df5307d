"""Stage configurations: YAML files in configs/, checked before anything heavy starts."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..dataschema import build_dataclass
from ..errors import ConfigError

MODEL_KINDS = ("transformer", "mlp")
DATA_KINDS = ("synthetic", "file")


@dataclass(frozen=True)
class ModelConfig:
    kind: str = "transformer"  # transformer | mlp (the MLP learns the same next-token task)
    vocab_size: int = 64
    dim: int = 64
    n_heads: int = 4
    n_layers: int = 2
    seq_len: int = 32


@dataclass(frozen=True)
class DataConfig:
    kind: str = "synthetic"  # synthetic: arithmetic sequences; file: a .npy array of token ids
    path: str | None = None
    batch_size: int = 16  # global, split over data-parallel ranks
    seed: int = 0


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    steps: int = 200
    lr: float = 3e-3
    strategy: str = "ddp"  # none | ddp | fsdp | fsdp+tp
    tp_size: int | None = None
    dtype: str | None = None  # FSDP compute dtype: bf16 | fp16
    checkpoint_every: int = 50
    log_every: int = 20
    seed: int = 0


@dataclass(frozen=True)
class EvalConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=lambda: DataConfig(seed=10_000))
    batches: int = 20
    strategy: str = "ddp"


def _check(cfg: Any, stage: str, source: str) -> None:
    from ..strategy import STRATEGIES, normalize_strategy

    def bad(field_: str, msg: str) -> ConfigError:
        return ConfigError(f"stage {stage!r}: {source}: {field_}: {msg}")

    m, d = cfg.model, cfg.data
    if m.kind not in MODEL_KINDS:
        raise bad("model.kind", f"{m.kind!r} is not one of {', '.join(MODEL_KINDS)}")
    if d.kind not in DATA_KINDS:
        raise bad("data.kind", f"{d.kind!r} is not one of {', '.join(DATA_KINDS)}")
    if d.kind == "file" and not d.path:
        raise bad("data.path", "data.kind 'file' needs a path to a .npy file of token ids")
    if d.kind == "file" and not Path(d.path).is_file():
        raise bad("data.path", f"{d.path} does not exist")
    if m.dim % m.n_heads:
        raise bad("model.n_heads", f"{m.n_heads} does not divide model.dim {m.dim}")
    for name in ("vocab_size", "dim", "n_heads", "n_layers", "seq_len"):
        if getattr(m, name) < 1:
            raise bad(f"model.{name}", "must be at least 1")
    if d.batch_size < 1:
        raise bad("data.batch_size", "must be at least 1")
    try:
        strategy = normalize_strategy(cfg.strategy)
    except ConfigError:
        raise bad("strategy", f"{cfg.strategy!r} is not one of {', '.join(STRATEGIES)}") from None
    if isinstance(cfg, TrainConfig):
        for name in ("steps", "checkpoint_every", "log_every"):
            if getattr(cfg, name) < 1:
                raise bad(name, "must be at least 1")
        if cfg.lr <= 0:
            raise bad("lr", "must be > 0")
        if cfg.tp_size is not None and strategy != "fsdp+tp":
            raise bad("tp_size", f"applies to strategy fsdp+tp, not {cfg.strategy!r}: remove it or change strategy")
    elif cfg.batches < 1:
        raise bad("batches", "must be at least 1")


def load_config(source: str | os.PathLike | Mapping[str, Any] | Any, kind: type, stage: str) -> Any:
    """A checked TrainConfig/EvalConfig from a YAML file, a mapping, or one already built."""
    if isinstance(source, kind):
        _check(source, stage, "config")
        return source
    where = "config"
    if isinstance(source, (str, os.PathLike)):
        import yaml

        where = str(source)
        try:
            source = yaml.safe_load(Path(source).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"stage {stage!r}: config file {where}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"stage {stage!r}: {where} is not valid YAML: {exc}") from None
    if not isinstance(source, Mapping):
        raise ConfigError(f"stage {stage!r}: {where}: expected a mapping of settings, got {type(source).__name__}")
    try:
        cfg = build_dataclass(kind, source, "", ConfigError)
    except ConfigError as exc:
        raise ConfigError(f"stage {stage!r}: {where}: {exc}") from None
    _check(cfg, stage, where)
    return cfg


def as_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
