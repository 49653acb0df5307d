"""Two small models for the built-in stages, tests and benchmarks.

Both keep their repeated blocks in an ``nn.ModuleList`` named ``blocks`` (what
``wrap_model`` shards one by one, and splits into pipeline stages: the parts named in
``pp_first``/``pp_last`` are None on the other stages, and ``forward`` skips them) and carry a ``tp_plan``: per block, which
linear layers split their output (colwise) or input (rowwise) features for
tensor parallelism. Under a plan a block sees only its share of the heads and
hidden features, so shapes are computed from the tensors, never from config.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class ResidualMLPBlock(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = FeedForward(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class MLP(nn.Module):
    """Regression/classification MLP: in -> ``depth`` residual blocks -> out."""

    tp_plan = {"mlp.fc1": "colwise", "mlp.fc2": "rowwise"}

    def __init__(self, in_dim: int = 32, dim: int = 64, out_dim: int = 1,
                 depth: int = 2, hidden: int | None = None) -> None:
        super().__init__()
        self.inp = nn.Linear(in_dim, dim)
        self.blocks = nn.ModuleList(ResidualMLPBlock(dim, hidden or 4 * dim) for _ in range(depth))
        self.out = nn.Linear(dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


class TokenMLP(nn.Module):
    """Next-token prediction from each token alone: embedding, residual MLP blocks, head."""

    tp_plan = MLP.tp_plan

    def __init__(self, vocab_size: int = 256, dim: int = 64, n_layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(ResidualMLPBlock(dim, 4 * dim) for _ in range(n_layers))
        self.head = nn.Linear(dim, vocab_size)

    pp_first, pp_last = ("embed",), ("head",)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) if self.embed is not None else tokens  # (None: a later pipeline stage)
        for block in self.blocks:
            x = block(x)
        return self.head(x) if self.head is not None else x


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"dim={dim} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads  # wrap_model checks it divides the tensor-parallel size
        self.head_dim = dim // n_heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism this rank holds n_heads / tp of them
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, n_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = FeedForward(dim, 4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """A small causal language model (token ids in, next-token logits out)."""

    tp_plan = {
        "attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.o": "rowwise",
        "mlp.fc1": "colwise", "mlp.fc2": "rowwise",
    }

    def __init__(self, vocab_size: int = 256, dim: int = 64, n_heads: int = 4,
                 n_layers: int = 2, max_seq_len: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Parameter(torch.zeros(max_seq_len, dim))
        self.blocks = nn.ModuleList(TransformerBlock(dim, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)

    pp_first, pp_last = ("embed", "pos"), ("norm", "head")
    context_parallel = True  # its attention is SDPA, and positions can be given (a context-parallel shard's)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if self.embed is not None:  # (None: a later pipeline stage, fed the previous stage's output)
            tokens = self.embed(tokens) + (self.pos[positions] if positions is not None
                                           else self.pos[: tokens.shape[1]])
        for block in self.blocks:
            tokens = block(tokens)
        return self.head(self.norm(tokens)) if self.head is not None else tokens
