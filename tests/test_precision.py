"""Precision is one setting, honoured at every world size and strategy and never dropped: autocast
for none/ddp and on one rank, FSDP2 mixed precision on several (tests/ranks), the built-in train
stage's ``precision`` (``dtype`` its older name), recorded in its history. On CPUs here; the GPU
figures come from benchmarks/bench_gpu.py on the accelerator machine."""

from __future__ import annotations

import pytest
import torch

import parsl_torch as pt
from parsl_torch.core.precision import default_precision, grad_scaler, normalize_precision
from parsl_torch.errors import ConfigError


@pytest.mark.parametrize("strategy", ["none", "ddp", "fsdp"])
@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_one_rank_computes_in_the_precision_asked_at_every_strategy(strategy, precision, dtype):
    model = torch.nn.Linear(8, 8)
    wrapped = pt.wrap_model(model, strategy=strategy, precision=precision)
    assert wrapped(torch.ones(2, 8)).dtype == dtype  # not returned unchanged in fp32
    assert model.weight.dtype == torch.float32  # the master weights stay fp32
    assert set(wrapped.state_dict()) == {"weight", "bias"}  # checkpoints look as they did


def test_fp32_and_no_precision_leave_the_model_as_it_is_and_dtype_is_an_alias():
    model = torch.nn.Linear(4, 4)
    assert pt.wrap_model(model, strategy="ddp") is model and "forward" not in vars(model)
    assert pt.wrap_model(model, precision="fp32")(torch.ones(1, 4)).dtype == torch.float32
    assert pt.wrap_model(torch.nn.Linear(4, 4), dtype="bfloat16")(torch.ones(1, 4)).dtype == torch.bfloat16
    assert pt.wrap_model(torch.nn.Linear(4, 4), precision=torch.float16)(torch.ones(1, 4)).dtype == torch.float16
    with pytest.raises(ConfigError, match="precision='bf16' and dtype='fp16' disagree"):
        pt.wrap_model(torch.nn.Linear(4, 4), precision="bf16", dtype="fp16")
    with pytest.raises(ConfigError, match="precision='int8' is not a precision: use one of fp32, bf16, fp16, float8"):
        pt.wrap_model(torch.nn.Linear(4, 4), precision="int8")


def test_the_default_is_bf16_on_gpus_and_fp32_on_cpus_and_fp16_gets_a_scaler():
    assert default_precision("cpu") == "fp32"
    assert normalize_precision("BFloat16") == "bf16" and normalize_precision(None) is None
    assert grad_scaler("bf16", "cpu") is None and grad_scaler("fp16", "cpu") is not None


def test_float8_is_refused_where_it_cannot_help_and_its_checkpoint_loads_without_it(monkeypatch):
    """float8 (torchao): the linear layers with dimensions divisible by 16 but the output layer are
    converted, their state dict loads strictly into the model without float8 (an evaluation in bf16) and a
    step runs; a CPU, a GPU without float8 tensor cores, a model with no such layer and no torchao are each
    refused, naming the fix (the GPU's speed is bench_gpu.py's)."""
    import sys

    pytest.importorskip("torchao")
    from parsl_torch.core.float8 import check_float8, float8_layers, to_float8
    from parsl_torch.core.models import Transformer
    from parsl_torch.stages.train import TrainConfig

    assert normalize_precision("fp8") == "float8" and TrainConfig(precision="float8").precision == "float8"
    with pytest.raises(ConfigError, match=r"precision='float8' needs an NVIDIA GPU of compute capability 8\.9 or "
                                          r"newer \(H100, H200, L40S...\); this rank runs on cpu: use precision 'bf16'"):
        pt.wrap_model(torch.nn.Linear(32, 32), strategy="none", precision="float8")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-40GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ConfigError, match=r"this rank's NVIDIA A100-SXM4-40GB \(compute capability 8\.0\) has no "
                                          r"float8 tensor cores: use precision 'bf16'"):
        check_float8("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_float8("cuda")  # an H100
    from parsl_torch.core.wrap import _in_precision

    with pytest.raises(ConfigError, match=r"precision='float8' with tensor parallelism is not supported: use fsdp"):
        _in_precision(torch.nn.Linear(32, 32), "float8", "cuda", tp=2)
    torch.manual_seed(0)
    model, plain = Transformer(64, 32, 2, 2, 16), Transformer(64, 32, 2, 2, 16)
    assert "head" not in float8_layers(model) and {"blocks.0.attn.q", "blocks.1.mlp.fc2"} <= set(float8_layers(model))
    to_float8(model)
    assert type(model.blocks[0].attn.q).__name__ == "Float8Linear" and type(model.head) is torch.nn.Linear
    plain.load_state_dict(model.state_dict(), strict=True)
    loss = torch.nn.functional.cross_entropy(model(torch.randint(0, 64, (2, 16))).reshape(-1, 64),
                                             torch.randint(0, 64, (32,)))
    loss.backward()
    assert torch.isfinite(loss) and model.blocks[0].attn.q.weight.grad is not None
    with pytest.raises(ConfigError, match=r"Sequential has no linear layer \(but its output layer\) with both "
                                          r"dimensions divisible by 16, so float8 would change nothing: use 'bf16'"):
        to_float8(torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Linear(32, 3)))
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    with pytest.raises(ConfigError, match=r"precision='float8' needs torchao: pip install 'parsl-torch\[float8\]'"):
        to_float8(Transformer(64, 32, 2, 1, 16))


@pytest.mark.slow
@pytest.mark.parametrize("precision, strategy", [(None, "ddp"), ("bf16", "ddp"), ("fp16", "fsdp")])
def test_the_train_stage_trains_in_its_precision_and_records_it(tmp_path, monkeypatch, precision, strategy):
    from parsl_torch.history.h5file import read_history
    from parsl_torch.stages.train import train

    monkeypatch.chdir(tmp_path)
    cfg = {"steps": 30, "log_every": 10, "checkpoint_every": 30, "lr": 0.01, "precision": precision,
           "strategy": strategy,
           "model": {"kind": "mlp", "vocab_size": 16, "dim": 16, "seq_len": 8}, "data": {"batch_size": 8}}
    with pt.workflow(site="local", run_dir="runs"):
        result = train(cfg).result(timeout=300)
    ran = precision or "fp32"  # the CPU's default
    assert result["precision"] == ran and result["final_loss"] < 2.7  # it learned (ln 16 = 2.77 at the start)
    history = read_history(result["history"])
    assert history.attrs["config"]["precision"] == ran
