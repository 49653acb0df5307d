"""The built-in stages' configs: every bad value is a ConfigError naming the field, before anything runs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsl_torch.errors import ConfigError
from parsl_torch.stages.config import load_config
from parsl_torch.stages.evaluate import EvalConfig
from parsl_torch.stages.train import TrainConfig


@pytest.mark.parametrize("overrides, message", [
    ({"lr": math.nan}, "lr: must be a finite number > 0, got nan"),
    ({"lr": math.inf}, "lr: must be a finite number > 0, got inf"),
    ({"lr": 0}, "lr: must be a finite number > 0"),
    ({"dtype": "int8", "strategy": "fsdp"}, "dtype='int8' is not a precision: use one of fp32, bf16, fp16"),
    ({"precision": "bf16", "dtype": "fp16"}, "precision: 'bf16' and dtype: 'fp16' disagree"),
    ({"tp_size": 0, "strategy": "fsdp+tp"}, "tp_size: must be at least 2"),
    ({"tp_size": -2, "strategy": "fsdp+tp"}, "tp_size: must be at least 2"),
    ({"activation_checkpointing": "every"}, "activation_checkpointing: .every. is not one of none, full, selective"),
    ({"seed": -1}, "seed: must be between 0 and 4294967295"),
    ({"data": {"seed": -3}}, r"data\.seed: must be between 0 and 4294967295"),
    ({"steps": 0}, "steps: must be at least 1"),
    ({"strategy": "zero3"}, "strategy: 'zero3' is not one of"),
])
def test_bad_train_values_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=rf"stage 'train': config: {message}"):
        load_config(overrides, TrainConfig, "train")


def test_a_setting_given_twice_in_a_config_file_is_refused_with_both_lines(tmp_path):
    """PyYAML keeps the last of two equal keys silently: a ``steps: 50`` pasted below ``steps: 200`` trained
    50 steps, and an edit of the first changed nothing. A merge key (``<<``) may still be overridden."""
    shipped = (Path(__file__).parent.parent / "configs" / "train.yaml").read_text()
    first, last = shipped.splitlines().index("steps: 200") + 1, len(shipped.splitlines()) + 1
    (tmp_path / "twice.yaml").write_text(shipped + "steps: 50\n")
    with pytest.raises(ConfigError, match=rf"stage 'train': .*twice\.yaml is not valid YAML: line {last}: the key "
                                          rf"'steps' is given a second time \(first on line {first}\), and only the "
                                          rf"last would count: keep one"):
        load_config(tmp_path / "twice.yaml", TrainConfig, "train")
    (tmp_path / "nested.yaml").write_text("model:\n  dim: 32\n  n_heads: 2\n  dim: 64\n")
    with pytest.raises(ConfigError, match=r"line 4: the key 'dim' is given a second time \(first on line 2\)"):
        load_config(tmp_path / "nested.yaml", TrainConfig, "train")
    (tmp_path / "merged.yaml").write_text("model:\n  <<: {dim: 32, n_heads: 2}\n  dim: 64\n")
    assert load_config(tmp_path / "merged.yaml", TrainConfig, "train").model.dim == 64


def test_a_token_file_is_checked_before_any_rank_starts(tmp_path):
    short = tmp_path / "short.npy"
    np.save(short, np.arange(10, dtype=np.int32))
    model = {"seq_len": 32}
    with pytest.raises(ConfigError, match=r"data\.path: .*short\.npy holds 10 tokens, too few for one sequence "
                                          r"of model\.seq_len=32 \(needs at least 33\)"):
        load_config({"model": model, "data": {"kind": "file", "path": str(short)}}, TrainConfig, "train")
    with pytest.raises(ConfigError, match=r"data\.path: .*short\.npy holds 10 tokens"):
        load_config({"model": model, "data": {"kind": "file", "path": str(short)}}, EvalConfig, "evaluate")
    floats = tmp_path / "floats.npy"
    np.save(floats, np.zeros(100))
    with pytest.raises(ConfigError, match=r"holds a float64 array of shape \(100,\); expected a 1-D array of int"):
        load_config({"data": {"kind": "file", "path": str(floats)}}, TrainConfig, "train")
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"not numpy")
    with pytest.raises(ConfigError, match=r"data\.path: .*junk\.npy is not a readable \.npy array"):
        load_config({"data": {"kind": "file", "path": str(junk)}}, TrainConfig, "train")
    good = tmp_path / "good.npy"
    np.save(good, np.arange(33, dtype=np.int64))
    assert load_config({"model": model, "data": {"kind": "file", "path": str(good)}}, TrainConfig, "train")


numbers = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.none(),
                    st.booleans(), st.text(max_size=6))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["steps", "lr", "tp_size", "checkpoint_every", "log_every", "seed",
                                        "dtype", "precision", "tf32", "strategy"]), numbers, max_size=4),
       st.dictionaries(st.sampled_from(["dim", "n_heads", "n_layers", "seq_len", "vocab_size"]), numbers,
                       max_size=3),
       st.dictionaries(st.sampled_from(["batch_size", "seed"]), numbers, max_size=2))
def test_fuzzed_train_values_give_a_config_or_a_config_error(top, model, data):
    try:
        cfg = load_config({**top, "model": model, "data": data}, TrainConfig, "train")
    except ConfigError as exc:
        assert str(exc).startswith("stage 'train': config: ")
        return
    assert 0 < cfg.lr < math.inf and cfg.steps >= 1 and cfg.seed >= 0 and cfg.data.seed >= 0


@pytest.mark.parametrize("config_class, name", [(TrainConfig, "train.yaml"), (EvalConfig, "eval.yaml")])
def test_the_shipped_configs_spell_out_every_field(config_class, name):
    """configs/train.yaml says "the defaults spelled out": every field of the stage's config (and of its
    model and data sections) is there, so a reader sees what can be set."""
    import dataclasses
    from pathlib import Path

    import yaml

    text = yaml.safe_load((Path(__file__).parent.parent / "configs" / name).read_text())

    def fields(record: object, data: dict, prefix: str = "") -> list[str]:
        left = []
        for f in dataclasses.fields(record):
            if f.name not in data:
                left.append(prefix + f.name)
            elif dataclasses.is_dataclass(section := getattr(record, f.name)):
                left += fields(section, data[f.name], f"{prefix}{f.name}.")
        return left

    assert not fields(config_class(), text), f"configs/{name} leaves out these fields"
    assert load_config(Path(__file__).parent.parent / "configs" / name, config_class, "s") is not None
