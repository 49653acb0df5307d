"""The built-in train stage on one GPU against a hand-written loop at the same precision, bf16
against fp32, compile on and off, float8 + compile against bf16 + compile (where the GPU has float8),
with MFU: printed as ratios measured in one process.

    python benchmarks/bench_gpu.py [--models big,small] [--steps 80] [--repeats 3]
    python benchmarks/bench_gpu.py --device cpu --models tiny --steps 5 --repeats 1   # the script itself, on a CPU

Each variant runs ``--repeats`` times, interleaved (a small model varies by +-20 % between runs);
its rate is the median over repeats of steps / seconds after warm-up steps, both loops doing the
same per-step work: the same batches from ``stages.data.batch`` copied to the device, and no
device sync per step (the loop keeps its loss on the device; the stage reads its history's loss
every ``READ_EVERY`` steps, ``History(read_every=)``). "fp32" uses TF32 matmuls, as the stage
does; the plain fp32 loop (TF32 off, torch's default) is the baseline of the bf16 ratio. The stage
is ``stages.train.run_train`` in this process (one rank), its rate from its history's ``dt`` (the
means over the steps between two reads). MFU: torchtitan's FLOPs per token (6N + 12 L d T) over
the device's dense bf16 peak (``core.flops``). The baseline, a plain torch loop, is measured in
the same run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from parsl_torch.core.float8 import check_float8, to_float8
from parsl_torch.core.flops import flops_per_token, peak_flops
from parsl_torch.core.models import Transformer
from parsl_torch.core.precision import autocast, use_tf32
from parsl_torch.history.h5file import read_history
from parsl_torch.stages.config import DataConfig, ModelConfig
from parsl_torch.stages.data import batch
from parsl_torch.stages.train import TrainConfig, run_train

#: name -> (vocab, dim, heads, layers, sequence, batch): "big" is the issue's ~160 M-parameter model
MODELS = {"big": (8192, 1024, 16, 12, 1024, 8), "small": (8192, 256, 4, 4, 256, 8), "tiny": (64, 32, 2, 1, 16, 4)}
WARMUP = 5
#: the stage's steps between two reads of its loss (its reads land on WARMUP - 1: the rate starts after)
READ_EVERY = 4
#: (precision, compiled) -> the stage's final loss of each repeat (the same steps and batches in each)
FINAL_LOSS: dict[tuple[str, bool], list[float]] = {}


def configs(name: str) -> tuple[ModelConfig, DataConfig]:
    vocab, dim, heads, layers, seq, size = MODELS[name]
    return (ModelConfig(vocab_size=vocab, dim=dim, n_heads=heads, n_layers=layers, seq_len=seq),
            DataConfig(batch_size=size))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hand_loop(name: str, precision: str, compiled: bool, steps: int, device: torch.device,
              tf32: bool = True) -> float:
    """Steps per second of a plain torch loop (no parsl-torch on the step path); ``tf32=False``
    is plain fp32, the baseline bf16 is compared with (torch's own default)."""
    model_cfg, data_cfg = configs(name)
    torch.manual_seed(0)
    model = Transformer(model_cfg.vocab_size, model_cfg.dim, model_cfg.n_heads, model_cfg.n_layers,
                        model_cfg.seq_len).to(device)
    if precision == "float8":
        to_float8(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda" or None)
    use_tf32(device.type, tf32 and precision == "fp32")
    forward = torch.compile(model) if compiled else model
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None

    def step(i: int) -> torch.Tensor:
        tokens = batch(data_cfg, model_cfg, i, 0, 1).to(device)
        with autocast(precision, device.type):
            logits = forward(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, model_cfg.vocab_size).float(), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss.detach()  # (no sync: the loop's loss stays on the device)

    for i in range(WARMUP):
        step(i)
    sync(device)
    t0 = time.perf_counter()
    for i in range(WARMUP, WARMUP + steps):
        step(i)
    sync(device)
    return steps / (time.perf_counter() - t0)


def stage(name: str, precision: str, compiled: bool, steps: int, device: torch.device) -> float:
    """Steps per second of the built-in train stage's loop after warm-up, from its history's dt: recorded
    at its reads of the loss, each the mean over the steps since the read before."""
    model_cfg, data_cfg = configs(name)
    cfg = TrainConfig(model=model_cfg, data=data_cfg, steps=WARMUP + steps, lr=3e-4, strategy="none",
                      precision=precision, compile=compiled, checkpoint_every=10**9, log_every=10**9,
                      read_every=READ_EVERY)
    with tempfile.TemporaryDirectory() as tmp:
        result = run_train(cfg, Path(tmp, "train.h5"), Path(tmp, "model.pt"))
        dt = read_history(result["history"]).metrics["dt"]
    FINAL_LOSS.setdefault((precision, compiled), []).append(result["final_loss"])
    reads = [i for i, value in enumerate(dt) if value == value]  # (between reads: NaN)
    spans = [(a, b) for a, b in zip(reads, reads[1:]) if a + 1 >= WARMUP]
    return sum(b - a for a, b in spans) / float(sum(dt[b] * (b - a) for a, b in spans))


def has_float8(device: torch.device) -> bool:
    try:
        check_float8(device.type)
        import torchao  # noqa: F401
    except Exception:  # noqa: BLE001 - no float8 here: the variant is left out, saying why
        return False
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="big,small")
    p.add_argument("--steps", type=int, default=80)  # 30 steps of the big model varied by +-8 %
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu needs a CUDA GPU (the accelerator machine); --device cpu checks the script")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_flops(device)
    print(f"device {name}, dense bf16 peak {peak / 1e12 if peak else float('nan'):.0f} TFLOP/s, torch {torch.__version__}")
    variants = [("fp32", False), ("bf16", False), ("bf16", True)]
    if has_float8(device):
        variants.append(("float8", True))
    else:
        print("float8: not measured (it needs an NVIDIA GPU of compute capability 8.9+ and torchao)")
    for model_name in args.models.split(","):
        model_cfg, data_cfg = configs(model_name)
        tokens = data_cfg.batch_size * model_cfg.seq_len
        per_token = flops_per_token(Transformer(model_cfg.vocab_size, model_cfg.dim, model_cfg.n_heads,
                                                model_cfg.n_layers, model_cfg.seq_len),
                                    model_cfg.n_layers, model_cfg.dim, model_cfg.seq_len)
        rates: dict[tuple[str, bool, str], list[float]] = {}
        for _ in range(args.repeats):  # interleaved: drift hits every variant alike
            rates.setdefault(("fp32", False, "plain"), []).append(
                hand_loop(model_name, "fp32", False, args.steps, device, tf32=False))
            for precision, compiled in variants:
                for kind, run in (("loop", hand_loop), ("stage", stage)):
                    rates.setdefault((precision, compiled, kind), []).append(
                        run(model_name, precision, compiled, args.steps, device))
        median = {k: statistics.median(v) for k, v in rates.items()}
        print(f"\nmodel {model_name}: {per_token / 6 / 1e6:.0f} M non-embedding parameters (approx.), "
              f"{tokens} tokens per step")
        for precision, compiled in variants:
            loop, ours = median[(precision, compiled, "loop")], median[(precision, compiled, "stage")]
            mfu = f", MFU {ours * tokens * per_token / peak:.1%}" if peak else ""
            print(f"  {precision}{' + compile' if compiled else '':<10} stage {ours:7.2f} steps/s, loop {loop:7.2f} "
                  f"-> stage/loop {ours / loop:.3f}x{mfu}")
        plain, bf16 = median[("fp32", False, "plain")], median[("bf16", False, "stage")]
        print(f"  plain fp32 loop (no TF32) {plain:7.2f} steps/s; bf16 (stage) / plain fp32: "
              f"{bf16 / plain:.2f}x, bf16 + compile: {median[('bf16', True, 'stage')] / plain:.2f}x")
        print(f"  bf16 / fp32 with TF32 (stage): {bf16 / median[('fp32', False, 'stage')]:.2f}x; "
              f"compile (stage, bf16): {median[('bf16', True, 'stage')] / median[('bf16', False, 'stage')]:.2f}x")
        if ("float8", True) in variants:
            print(f"  float8 + compile / bf16 + compile (stage, tokens/s): "
                  f"{median[('float8', True, 'stage')] / median[('bf16', True, 'stage')]:.2f}x; loss after "
                  f"{WARMUP + args.steps} steps: float8 {statistics.median(FINAL_LOSS[('float8', True)]):.4f}, "
                  f"bf16 {statistics.median(FINAL_LOSS[('bf16', True)]):.4f}")
        FINAL_LOSS.clear()


if __name__ == "__main__":
    main()
