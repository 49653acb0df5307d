"""Throughput in the train stage's history without any extra device sync: FLOPs per token as
torchtitan counts them (6N + 12 L d T), TFLOP/s per device, tokens/s over the ranks, and MFU
against the device's dense bf16 peak (a table of the facilities' GPUs, or PARSL_TORCH_PEAK_TFLOPS);
torch.compile as a train option, its compile time kept apart. Arithmetic and the CPU path here;
the GPU figures come from the accelerator machine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import parsl_torch as pt
from parsl_torch.core.flops import flops_per_token, peak_flops, throughput
from parsl_torch.core.models import Transformer


def test_flops_per_token_is_6n_without_embeddings_plus_the_attention_term():
    model = Transformer(vocab_size=64, dim=32, n_heads=2, n_layers=2, max_seq_len=16)
    params = sum(p.numel() for p in model.parameters())
    embeddings = sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters())
    assert 0 < embeddings < params
    assert flops_per_token(model, 2, 32, 16) == 6 * (params - embeddings) + 12 * 2 * 32 * 16
    assert flops_per_token(torch.nn.Linear(10, 10)) == 6 * 110


def test_mfu_is_achieved_flops_over_the_peak_and_the_peak_comes_from_the_table_or_the_setting(monkeypatch):
    out = throughput(tokens=1000, seconds=0.5, flops_per_token_=1e9, peak=4e12, devices=8)
    assert out == {"tokens_per_s": 16000.0, "tflops": 2.0, "mfu": 0.5}
    assert "mfu" not in throughput(1000, 0.5, 1e9, None) and throughput(1000, 0.0, 1e9, 1e12) == {}
    monkeypatch.delenv("PARSL_TORCH_PEAK_TFLOPS", raising=False)
    assert peak_flops(torch.device("cpu")) is None  # no MFU on a CPU
    monkeypatch.setenv("PARSL_TORCH_PEAK_TFLOPS", "989")
    assert peak_flops(torch.device("cpu")) == 989e12
    monkeypatch.setenv("PARSL_TORCH_PEAK_TFLOPS", "fast")
    with pytest.raises(pt.ConfigError, match="PARSL_TORCH_PEAK_TFLOPS='fast': give the accelerator's dense bf16"):
        peak_flops(torch.device("cpu"))


def test_your_own_loop_gets_tokens_per_second_tflops_and_mfu_in_one_call(monkeypatch):
    """pt.Throughput: the model (before wrap_model) in, each step's tokens in, the built-in stage's figures out."""
    monkeypatch.delenv("PARSL_TORCH_PEAK_TFLOPS", raising=False)
    model = Transformer(vocab_size=64, dim=32, n_heads=2, n_layers=2, max_seq_len=16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = pt.Throughput(model, n_layers=2, dim=32, seq_len=16)
    assert meter.flops_per_token == flops_per_token(model, 2, 32, 16) and meter.peak is None
    assert meter.step(tokens=64) == {}  # the first call starts the clock
    for _ in range(3):
        tokens = torch.randint(0, 64, (4, 17))
        loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).reshape(-1, 64), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        stats = meter.step(tokens=tokens[:, :-1].numel())
        assert stats["tokens_per_s"] > 0 and stats["tflops"] > 0 and "mfu" not in stats  # no MFU on a CPU
    monkeypatch.setenv("PARSL_TORCH_PEAK_TFLOPS", "2")
    timed = pt.Throughput(model, n_layers=2, dim=32, seq_len=16).step(tokens=1000, seconds=0.5)
    assert timed["mfu"] == pytest.approx(timed["tflops"] / 2) and timed["tokens_per_s"] == 2000


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.5),
    ("NVIDIA H200", 989.0), ("NVIDIA GH200 480GB", 989.0), ("NVIDIA A100-SXM4-40GB", 312.0),
    ("AMD Instinct MI250X", 191.5), ("Intel(R) Data Center GPU Max 1550", 419.5), ("NVIDIA GeForce RTX 4090", None),
])
def test_the_peak_is_the_parts_own_as_torch_names_it(monkeypatch, name, tflops):
    monkeypatch.delenv("PARSL_TORCH_PEAK_TFLOPS", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda", 0)) == (tflops * 1e12 if tflops else None)


@pytest.mark.slow
def test_the_train_stage_records_throughput_and_mfu_and_compiles_when_asked(tmp_path, monkeypatch):
    from parsl_torch.apps.session.status import read, plain
    from parsl_torch.history.h5file import read_history
    from parsl_torch.stages.train import train

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PARSL_TORCH_PEAK_TFLOPS", "0.5")  # a made-up peak, so a CPU has an MFU
    cfg = {"steps": 6, "log_every": 2, "checkpoint_every": 6, "compile": True,
           "model": {"kind": "transformer", "vocab_size": 16, "dim": 16, "n_heads": 2, "n_layers": 1, "seq_len": 8},
           "data": {"batch_size": 4}}
    eager = {**cfg, "compile": False, "steps": 7, "log_every": 100}  # (a logged step reads its loss too)
    with pt.workflow(site="local", run_dir="runs"):
        result = train(cfg, ranks_per_node=1).result(timeout=600)
        each = train(eager, ranks_per_node=1)
        every_3 = read_history(train({**eager, "read_every": 3}, ranks_per_node=1).result(timeout=600)["history"])
        each = read_history(each.result(timeout=600)["history"])
    history = read_history(result["history"])
    assert {"tokens_per_s", "tflops", "mfu"} <= set(history.metrics)
    assert result["compile_s"] > 0
    rows = history.metrics
    assert all(v > 0 for v in rows["tokens_per_s"]) and all(0 < v < 1e6 for v in rows["mfu"])
    data, stages = read(tmp_path / "runs")
    assert "MFU " in plain(data, stages)  # parsl-torch status shows it
    # the loss read every 3 steps (as on a GPU): every step's loss, as read each step; the time and
    # throughput at the reads (0, 3 and the last step), as the means since the read before
    assert list(every_3.steps) == list(range(7)) and list(every_3.metrics["loss"]) == list(each.metrics["loss"])
    assert [s for s, dt in zip(every_3.steps, every_3.metrics["dt"]) if dt > 0] == [0, 3, 6]
    assert not np.isnan(each.metrics["mfu"]).any() and np.isnan(every_3.metrics["mfu"][[1, 2, 4, 5]]).all()
