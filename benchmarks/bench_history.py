"""History overheads against plain Python, measured side by side in one run.

1. Per-call cost of ``History.update`` with 8 scalar metrics vs appending the
   same 8 floats to a plain dict of lists (target <= 5 us per call).
2. Training-loop throughput (a small CPU MLP) with and without a History
   update per step, file flushes included (target >= 0.98x).
3. Time and size to write 1e6 steps x 8 metrics with ``finalize``
   (target <= 1 s).

usage: python benchmarks/bench_history.py [--calls 200000] [--steps 3000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import parsl_torch as pt

KEYS = [f"m{i}" for i in range(8)]


def per_call(calls: int, tmp: Path) -> tuple[float, float, float]:
    """(plain dict-of-lists, History.update alone, with default syncs and flushes) in us."""
    metrics = {k: 0.5 + i for i, k in enumerate(KEYS)}
    plain: dict[str, list[float]] = {k: [] for k in KEYS}
    t0 = time.perf_counter()
    for _ in range(calls):
        for k, v in metrics.items():
            plain[k].append(v)
    t_plain = (time.perf_counter() - t0) / calls * 1e6

    results = []
    for sync_every in (0, 100):  # 0: never syncs; 100: the default
        h = pt.History("bench", path=tmp / f"u{sync_every}.h5", sync_every=sync_every)
        update = h.update
        t0 = time.perf_counter()
        for _ in range(calls):
            update(metrics)
        results.append((time.perf_counter() - t0) / calls * 1e6)
    return t_plain, results[0], results[1]


def loop_throughput(steps: int, tmp: Path, with_history: bool) -> float:
    torch.manual_seed(0)
    model = pt.models.MLP(in_dim=32, dim=64, depth=2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, y = torch.randn(64, 32), torch.randn(64, 1)
    h = pt.History("loop", path=tmp / "loop.h5") if with_history else None
    t0 = time.perf_counter()
    for step in range(steps):
        t_step = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if h is not None:
            h.update({"loss": loss.item(), "dt": time.perf_counter() - t_step, "step": step})
    elapsed = time.perf_counter() - t0
    if h is not None:
        h.finalize(plot=False)
    return steps / elapsed


def realistic_metrics(steps: int) -> dict[str, list[float]]:
    """Eight training-like series: float32 values (what loss.item() gives), noisy."""
    import numpy as np

    rng = np.random.default_rng(0)
    t = np.arange(steps)
    noise = lambda scale: rng.normal(0, scale, steps)  # noqa: E731
    series = {
        "loss": 4 * np.exp(-t / 2e5) + 0.1 + noise(0.05), "acc": 1 - np.exp(-t / 2e5) + noise(0.01),
        "lr": 3e-4 * 0.5 * (1 + np.cos(np.pi * t / steps)), "grad_norm": np.abs(1 + noise(0.3)),
        "dt": 0.03 + np.abs(noise(0.002)), "tokens_per_s": 1e5 + noise(2e3),
        "mem_gb": 20 + noise(0.01), "eval_loss": 4 * np.exp(-t / 2e5) + 0.2 + noise(0.02),
    }
    return {k: v.astype(np.float32).astype(float).tolist() for k, v in series.items()}


def write_million(tmp: Path, steps: int = 1_000_000) -> tuple[float, float]:
    h = pt.History("big", path=tmp / "big.h5", flush_every=1e9)  # one write, at finalize
    series = realistic_metrics(steps)
    keys = list(series)
    for i in range(steps):
        h.update({k: series[k][i] for k in keys})
    t0 = time.perf_counter()
    path = h.finalize(plot=False)
    return time.perf_counter() - t0, path.stat().st_size / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=200_000)
    p.add_argument("--steps", type=int, default=3000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        t_plain, t_update, t_flushing = per_call(args.calls, tmp)
        print(f"1. update, 8 scalars: {t_update:.2f} us/call alone, {t_flushing:.2f} us/call with the default "
              f"syncs (every 100) and flushes; plain dict-of-lists {t_plain:.2f} us -> {t_update / t_plain:.2f}x plain "
              f"(target <= 5 us)")
        rates: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(5):
            for flag in (False, True):
                rates[flag].append(loop_throughput(args.steps, tmp, flag))
        with_h, without = statistics.median(rates[True]), statistics.median(rates[False])
        print(f"2. training loop: {with_h:.0f} steps/s with History, {without:.0f} without -> "
              f"{with_h / without:.3f}x (target >= 0.98x)")
        seconds, mib = write_million(tmp)
        print(f"3. finalize 1e6 steps x 8 metrics: {seconds:.2f} s, {mib:.1f} MiB on disk "
              f"(raw {8e6 * 8 / 2**20:.0f} MiB) (target <= 1 s)")


if __name__ == "__main__":
    main()
