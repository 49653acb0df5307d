"""Token batches for the built-in stages: deterministic by (seed, step), so
every run, resume and evaluation sees exactly the data it should."""

from __future__ import annotations

import numpy as np
import torch

from .config import DataConfig, ModelConfig


def synthetic_tokens(seed: int, step: int, batch: int, seq_len: int, vocab: int) -> torch.Tensor:
    """Arithmetic sequences mod vocab: each next token follows from the two before."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    stride = torch.randint(1, 4, (batch, 1), generator=g)
    return (start + stride * torch.arange(seq_len)) % vocab


def file_tokens(path: str, seed: int, step: int, batch: int, seq_len: int) -> torch.Tensor:
    tokens = np.load(path, mmap_mode="r")
    rng = np.random.default_rng(seed * 1_000_003 + step)
    starts = rng.integers(0, len(tokens) - seq_len, size=batch)
    return torch.from_numpy(np.stack([np.asarray(tokens[s:s + seq_len], dtype=np.int64) for s in starts]))


def batch(data: DataConfig, model: ModelConfig, step: int, dp_rank: int, dp_size: int) -> torch.Tensor:
    """This data-parallel rank's share of the global batch of ``step``."""
    if data.kind == "file":
        tokens = file_tokens(data.path, data.seed, step, data.batch_size, model.seq_len)
    else:
        tokens = synthetic_tokens(data.seed, step, data.batch_size, model.seq_len, model.vocab_size)
    return tokens.chunk(dp_size)[dp_rank] if dp_size <= data.batch_size else tokens[:0]
