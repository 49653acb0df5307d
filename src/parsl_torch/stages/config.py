"""What every built-in stage's config shares: the model and data sections, the
strategy check, and loading from YAML, a mapping or a built record.

Each record checks itself when it is built (``__post_init__``), so a config
that exists is a valid one, however it was made; ``load_config`` adds the
stage and the file to the message. A stage's own config class lives in the
stage's module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common import yamlfile
from ..common.records import build_dataclass
from ..core.strategy import STRATEGIES, normalize_strategy
from ..errors import ConfigError

MODEL_KINDS = ("transformer", "mlp")
DATA_KINDS = ("synthetic", "file")


def at_least(record: Any, minimum: float, *names: str) -> None:
    """ConfigError naming the first of ``names`` below ``minimum``."""
    for name in names:
        if getattr(record, name) < minimum:
            raise ConfigError(f"{name}: must be at least {minimum:g}, got {getattr(record, name)!r}")


#: seeds feed torch.Generator and numpy (with the step mixed in): they must stay well inside 64 bits
MAX_SEED = 2**32 - 1


def check_seed(record: Any, name: str) -> None:
    """A seed is an int in [0, 2**32): a bigger one (a time_ns()) overflows on every rank at its first batch."""
    value = getattr(record, name)
    if not 0 <= value <= MAX_SEED:
        raise ConfigError(f"{name}: must be between 0 and {MAX_SEED} (2**32 - 1), got {value!r}: use a smaller "
                          f"number, e.g. {value % (MAX_SEED + 1)} (the value mod 2**32)")


def check_strategy(strategy: str) -> str:
    """The strategy spelled canonically, or a ConfigError naming the field."""
    try:
        return normalize_strategy(strategy)
    except ConfigError:
        raise ConfigError(f"strategy: {strategy!r} is not one of {', '.join(STRATEGIES)}") from None


@dataclass(frozen=True)
class ModelConfig:
    kind: str = "transformer"  # transformer | mlp (the MLP learns the same next-token task)
    vocab_size: int = 64
    dim: int = 64
    n_heads: int = 4
    n_layers: int = 2
    seq_len: int = 32

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise ConfigError(f"kind: {self.kind!r} is not one of {', '.join(MODEL_KINDS)}")
        at_least(self, 1, "vocab_size", "dim", "n_heads", "n_layers", "seq_len")
        if self.dim % self.n_heads:
            raise ConfigError(f"n_heads: {self.n_heads} does not divide dim {self.dim}")


@dataclass(frozen=True)
class DataConfig:
    kind: str = "synthetic"  # synthetic: arithmetic sequences; file: a .npy array of token ids
    path: str | None = None
    batch_size: int = 16  # global, split over data-parallel ranks
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in DATA_KINDS:
            raise ConfigError(f"kind: {self.kind!r} is not one of {', '.join(DATA_KINDS)}")
        if isinstance(self.path, str) and self.path:  # the ranks start in the stage's directory
            object.__setattr__(self, "path", os.path.abspath(self.path))
        if self.kind == "file" and not self.path:
            raise ConfigError("path: data.kind 'file' needs a path to a .npy file of token ids")
        if self.kind == "file" and not Path(self.path).is_file():
            raise ConfigError(f"path: {self.path} does not exist")
        at_least(self, 1, "batch_size")
        check_seed(self, "seed")


def data_files(data: DataConfig) -> tuple[str, ...]:
    """The files a stage reads by its data config: part of the stage's identity."""
    return (data.path,) if data.kind == "file" and data.path else ()


def check_data_fits_model(data: DataConfig, model: ModelConfig) -> None:
    """A token file must be a 1-D integer array longer than one sequence (checked from its header:
    the file is not read), else every rank fails at its first batch."""
    if data.kind != "file":
        return
    import numpy as np

    try:
        tokens = np.load(data.path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"data.path: {data.path} is not a readable .npy array ({exc})") from None
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise ConfigError(f"data.path: {data.path} holds a {tokens.dtype} array of shape {tokens.shape}; "
                          f"expected a 1-D array of integer token ids")
    if len(tokens) <= model.seq_len:
        raise ConfigError(f"data.path: {data.path} holds {len(tokens)} tokens, too few for one sequence of "
                          f"model.seq_len={model.seq_len} (needs at least {model.seq_len + 1})")


def load_config(source: str | os.PathLike | Mapping[str, Any] | Any, config_class: type, stage: str) -> Any:
    """A checked ``config_class`` record from a YAML file, a mapping, or one already built."""
    if isinstance(source, config_class):
        return source  # checked when it was built
    where = "config"
    if isinstance(source, (str, os.PathLike)):
        import yaml

        where = str(source)
        try:
            source = yamlfile.safe_load(Path(source).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"stage {stage!r}: config file {where}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"stage {stage!r}: config file {where} is not UTF-8 text (byte {exc.start}): "
                              f"save it as UTF-8") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"stage {stage!r}: {where} is not valid YAML: {exc}") from None
    if not isinstance(source, Mapping):
        raise ConfigError(f"stage {stage!r}: {where}: expected a mapping of settings, got {type(source).__name__}")
    try:
        return build_dataclass(config_class, source, "", ConfigError)
    except ConfigError as exc:
        raise ConfigError(f"stage {stage!r}: {where}: {exc}") from None
