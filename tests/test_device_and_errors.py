"""Device/backend choice and the errors a user gets for bad settings."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import parsl_torch as pt
from parsl_torch.core.device import get_backend, get_torch_device_type
from parsl_torch.core.models import MLP, Transformer
from parsl_torch.core.strategy import normalize_strategy
from parsl_torch.core.blocks import find_blocks
from parsl_torch.errors import ConfigError

from .conftest import clean_env


def test_cpu_machine_defaults(monkeypatch):
    monkeypatch.delenv("TORCH_DEVICE", raising=False)
    monkeypatch.delenv("TORCH_BACKEND", raising=False)
    assert get_torch_device_type() == "cpu"
    assert get_backend() == "gloo"
    assert pt.get_torch_device() == torch.device("cpu")


def test_overrides(monkeypatch):
    monkeypatch.setenv("TORCH_DEVICE", "cuda")
    monkeypatch.delenv("TORCH_BACKEND", raising=False)
    assert get_torch_device_type() == "cuda"
    assert get_backend() == "nccl"
    monkeypatch.setenv("TORCH_DEVICE", "xpu")  # xccl where this torch has it, else oneCCL's ccl (ezpz's rule)
    import torch.distributed as dist

    for has_xccl, expected in ((True, "xccl"), (False, "ccl")):
        monkeypatch.setattr(dist, "is_backend_available", lambda name, has=has_xccl: has and name == "xccl")
        assert get_backend() == expected
    monkeypatch.setenv("TORCH_DEVICE", "cpu")
    monkeypatch.setenv("TORCH_BACKEND", "mpi")
    assert get_backend() == "mpi"


@pytest.mark.parametrize("var, value, needle", [
    ("TORCH_DEVICE", "tpu", "TORCH_DEVICE='tpu' is not a device type"),
    ("TORCH_BACKEND", "bogus", "TORCH_BACKEND='bogus' is not a known backend"),
    ("TORCH_BACKEND", "nccl", "needs cuda devices"),
])
def test_bad_device_settings(monkeypatch, var, value, needle):
    monkeypatch.setenv("TORCH_DEVICE", "cpu")
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=needle):
        get_backend()


def test_world_of_one_returns_the_model_unchanged():
    model = MLP()
    for strategy in ("none", "ddp", "fsdp", "FSDP2"):  # (torch's name of the FSDP that fsdp is)
        assert pt.wrap_model(model, strategy=strategy) is model
    assert normalize_strategy("fsdp2_tp") == "fsdp+tp"
    assert pt.wrap_model(model, use_fsdp=False) is model


@pytest.mark.parametrize("kwargs, needle", [
    ({"strategy": "zero3"}, "strategy='zero3' is unknown: use one of none, ddp, fsdp, fsdp\\+tp"),
    ({"strategy": "ddp", "use_fsdp": True}, "use_fsdp=True contradicts"),
    ({"strategy": "fsdp", "dtype": "int3"}, "dtype='int3' is not a precision"),
    ({"strategy": "fsdp+tp"}, "needs tp_size"),
    ({"strategy": "fsdp+tp", "tp_size": 2}, "tp_size=2 does not divide the world size 1"),
    ({"strategy": "ddp", "tp_size": 2}, "apply to strategy 'fsdp\\+tp'"),
])
def test_bad_wrap_arguments(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        pt.wrap_model(Transformer(), **kwargs)


def test_tp_plan_checks_against_the_model():
    with pytest.raises(ConfigError, match="needs a tensor-parallel plan for Sequential.*no repeated blocks"):
        pt.wrap_model(torch.nn.Sequential(torch.nn.Linear(4, 4)), "fsdp+tp", tp_size=1)
    with pytest.raises(ConfigError, match="tp_plan names 'attn.qkv', which block 0 does not have"):
        pt.wrap_model(Transformer(), "fsdp+tp", tp_size=1, tp_plan={"attn.qkv": "colwise"})
    with pytest.raises(ConfigError, match="tp_plan\\['attn.q'\\]='diagonal'"):
        pt.wrap_model(Transformer(), "fsdp+tp", tp_size=1, tp_plan={"attn.q": "diagonal"})


def test_tp_divisibility_is_checked_before_any_collective():
    from parsl_torch.core.wrap import _check_tp

    with pytest.raises(ConfigError, match="3 attention heads are not divisible by tp_size=2"):
        _check_tp(Transformer(dim=48, n_heads=3), world=4, tp_size=2, tp_plan=None)
    with pytest.raises(ConfigError, match="mlp.fc1 has 36 features, not divisible by tp_size=8"):
        _check_tp(MLP(dim=9, hidden=36), world=8, tp_size=8, tp_plan=None)


def test_blocks_are_the_repeated_layers():
    model = Transformer(n_layers=3)
    assert find_blocks(model) == list(model.blocks)


def test_activation_checkpointing_recomputes_the_chosen_blocks_with_the_same_gradients_and_names():
    """full, selective (every 2nd), selective:K; the same loss and gradients as the plain model, the same
    parameter names (a checkpoint reads either way), fewer tensors kept for the backward pass."""
    import copy

    torch.manual_seed(0)
    plain = Transformer(vocab_size=32, dim=16, n_heads=2, n_layers=4, max_seq_len=8)
    tokens = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(1))

    def step(model):
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
            loss = model(tokens).float().logsumexp(-1).mean()
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}, len(kept)

    base_loss, base_grads, base_kept = step(copy.deepcopy(plain))
    for mode, recomputed in (("full", [0, 1, 2, 3]), ("selective", [0, 2]), ("selective:3", [0, 3])):
        model = pt.wrap_model(copy.deepcopy(plain), strategy="none", activation_checkpointing=mode)
        assert [i for i, b in enumerate(model.blocks) if "forward" in vars(b)] == recomputed
        loss, grads, kept = step(model)
        assert loss == base_loss and grads.keys() == base_grads.keys()
        assert all(torch.equal(grads[n], base_grads[n]) for n in grads)
        assert kept < base_kept and model.state_dict().keys() == plain.state_dict().keys()
    assert pt.wrap_model(copy.deepcopy(plain), activation_checkpointing="none").blocks[0].forward.__self__ is not None
    for bad in ("some", "selective:0", "selective:x", 3):
        with pytest.raises(ConfigError, match="activation_checkpointing: .* is not one of none, full, selective"):
            pt.wrap_model(copy.deepcopy(plain), activation_checkpointing=bad)
    with pytest.raises(ConfigError, match="no repeated blocks"):
        pt.wrap_model(torch.nn.Linear(2, 2), activation_checkpointing="full")


def test_import_is_lazy_and_configures_nothing():
    code = ("import logging, sys, parsl_torch as pt; "
            "heavy = [m for m in ('torch', 'parsl', 'h5py', 'wandb') if m in sys.modules]; "
            "assert not heavy, heavy; "
            "assert not logging.getLogger('parsl_torch').handlers; "
            "assert not logging.getLogger().handlers; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_logger_is_rank_zero_only_and_idempotent():
    code = ("import parsl_torch as pt; "
            "a = pt.get_logger('demo'); b = pt.get_logger('demo'); assert a is b; "
            "assert len(a.handlers) == 1, a.handlers; a.info('hello from rank'); "
            "pt.get_logger('loud', rank_zero_only=False).info('everyone')")
    base = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    r0 = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env=clean_env(RANK="0", LOCAL_RANK="0", **base))
    r1 = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env=clean_env(RANK="1", LOCAL_RANK="1", **base))
    assert r0.returncode == r1.returncode == 0, r0.stderr + r1.stderr
    assert "[rank 0][demo] hello from rank" in r0.stderr
    assert "hello" not in r1.stderr
    assert "[rank 1][loud] everyone" in r1.stderr


def test_timeitlogit_logs_duration(capfd):
    @pt.timeitlogit
    def work(x):
        return x * 2

    assert work(21) == 42
    assert "took" in capfd.readouterr().err


def test_cli_info_and_error_exit(monkeypatch):
    from parsl_torch.cli import main

    monkeypatch.setenv("TORCH_BACKEND", "bogus")
    assert main(["info"]) == 2
    monkeypatch.delenv("TORCH_BACKEND")
    assert main(["info", "--json"]) == 0


def test_a_stage_future_whose_outcome_cannot_be_read_fails_naming_the_stage_and_never_hangs():
    """Settled in the app future's done callback, where an error is only logged: a route's answer that
    raises something unforeseen would leave the stage's future unresolved and the workflow waiting."""
    from concurrent.futures import Future

    from parsl_torch.apps.stage.futures import StageFuture
    from parsl_torch.errors import StageError

    class AppFuture(Future):
        outputs: list = []

    def answer(value: dict) -> tuple:
        raise KeyError("skipped")  # (a remote answer of another shape)

    app = AppFuture()
    future = StageFuture("s", app, None, None, answer=answer)
    app.set_result({"value": 1})
    with pytest.raises(StageError, match=r"^stage 's' ended, but its outcome could not be read: KeyError: 'skipped'"):
        future.result(timeout=5)
