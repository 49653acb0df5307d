"""A short distributed training run: ``mpiexec -n 2 python -m parsl_torch.demo``.

Trains the package's small Transformer on a synthetic, learnable token
sequence, so the loss visibly falls within a few dozen steps on a laptop CPU.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import parsl_torch as pt
from parsl_torch.models import Transformer


def synthetic_tokens(step: int, batch: int, seq_len: int, vocab: int) -> torch.Tensor:
    """Arithmetic sequences mod vocab: the next token follows from the last two."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    stride = torch.randint(1, 4, (batch, 1), generator=g)
    return (start + stride * torch.arange(seq_len)) % vocab


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--strategy", default="ddp", help="none | ddp | fsdp | fsdp+tp")
    p.add_argument("--tp-size", type=int, default=None, help="tensor-parallel size for fsdp+tp")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=16, help="global batch size")
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args(argv)

    rank = pt.setup_torch(seed=0)
    logger = pt.get_logger("parsl_torch.demo")
    vocab, seq_len = 64, 32
    model = Transformer(vocab_size=vocab, dim=64, n_heads=4, n_layers=2, max_seq_len=seq_len)
    model = pt.wrap_model(model.to(pt.get_torch_device()), strategy=args.strategy, tp_size=args.tp_size)
    dp_rank, dp_size = pt.data_parallel_coords(args.tp_size or 1)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    t0, loss = time.perf_counter(), torch.tensor(float("nan"))
    for step in range(args.steps):
        tokens = synthetic_tokens(step, args.batch, seq_len, vocab).chunk(dp_size)[dp_rank]
        tokens = tokens.to(pt.get_torch_device())
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab).float(), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            logger.info("step %d loss %.4f", step, loss.item())
    logger.info("rank %d done: %d steps in %.2fs, %s over %d rank(s)",
                rank, args.steps, time.perf_counter() - t0, args.strategy, pt.get_world_size())
    pt.cleanup()
    return loss.item()


if __name__ == "__main__":
    main()
