"""Sharded (DCP) checkpoints of the train stage: written by every rank, read at any world size,
exported to one file, and never half-written."""

from __future__ import annotations

import json
import subprocess
import sys

import h5py
import pytest
import yaml

from parsl_torch.stages import checkpoint

from .conftest import BIN, clean_env

TRAIN = {"steps": 20, "checkpoint_every": 10, "log_every": 10, "strategy": "fsdp",
         "model": {"dim": 32, "n_heads": 2, "n_layers": 2, "seq_len": 16}}
EVAL = {"model": TRAIN["model"], "batches": 4}


def _stage(tmp_path, module: str, ranks: int, *args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "parsl-torch"), "launch", "-n", str(ranks), "--", sys.executable, "-m",
                           f"parsl_torch.stages.{module}", *args], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=env or clean_env())


def _result(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """fsdp on 4 ranks, uninterrupted: its directory and result."""
    root = tmp_path_factory.mktemp("dcp")
    (root / "train.yaml").write_text(yaml.safe_dump(TRAIN))
    (root / "eval.yaml").write_text(yaml.safe_dump(EVAL))
    return root, _result(_stage(root, "train", 4, "--config", "train.yaml", "--checkpoint", "ck"))


@pytest.mark.slow
def test_four_ranks_write_shards_and_one_or_two_ranks_evaluate_them_as_the_exported_file(trained):
    root, _ = trained
    ck = root / "ck"
    assert ck.is_symlink() and ck.resolve().name == "000000020"
    assert sorted(p.name for p in ck.resolve().glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(4)]
    meta = json.loads((ck / "meta.json").read_text())
    assert (meta["step"], meta["strategy"], meta["world_size"]) == (20, "fsdp", 4)
    one = _result(_stage(root, "evaluate", 1, "--config", "eval.yaml", "--checkpoint", "ck", "--history", "e1.h5"))
    two = _result(_stage(root, "evaluate", 2, "--config", "eval.yaml", "--checkpoint", "ck", "--history", "e2.h5"))
    assert one["trained_steps"] == two["trained_steps"] == 20
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-6) and two["eval_acc"] == one["eval_acc"]
    out = subprocess.run([str(BIN / "parsl-torch"), "checkpoint", "export", "ck", "full.pt"], capture_output=True,
                         text=True, timeout=300, cwd=root, env=clean_env())
    assert out.returncode == 0, out.stderr
    full = _result(_stage(root, "evaluate", 1, "--config", "eval.yaml", "--checkpoint", "full.pt",
                          "--history", "ef.h5"))
    assert full["eval_loss"] == one["eval_loss"] and full["eval_acc"] == one["eval_acc"]  # the full-state path
    other = {**EVAL, "model": {**EVAL["model"], "dim": 16}}
    (root / "other.yaml").write_text(yaml.safe_dump(other))
    refused = _stage(root, "evaluate", 1, "--config", "other.yaml", "--checkpoint", "ck", "--history", "x.h5")
    assert refused.returncode != 0 and "model.dim=16 but checkpoint ck holds a model with model.dim=32" in refused.stderr


@pytest.mark.slow
def test_a_rank_killed_while_saving_leaves_the_previous_checkpoint_and_the_rerun_resumes_exactly(tmp_path, trained):
    _, uninterrupted = trained
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(TRAIN))
    args = ("--config", "train.yaml", "--checkpoint", "ck")
    killed = _stage(tmp_path, "train", 4, *args, env=clean_env(PARSL_TORCH_FAULT="killsave@1:20"))
    assert killed.returncode == 137 and "rank 1 on" in killed.stderr
    assert (tmp_path / "ck").resolve().name == "000000010"  # the half-written step 20 is not taken
    assert checkpoint.read(tmp_path / "ck")["step"] == 10
    resumed = _result(_stage(tmp_path, "train", 4, *args))
    assert resumed["resumed_from"] == 10
    assert resumed["final_loss"] == uninterrupted["final_loss"]
    with h5py.File(tmp_path / "train.h5") as f:
        assert list(f["step"][:]) == list(range(20))
    assert [p.name for p in (tmp_path / "ck.steps").iterdir()] == ["000000020"]  # older steps removed


@pytest.mark.slow
@pytest.mark.lowest
def test_resumed_on_fewer_ranks_the_global_batch_and_the_losses_stay_those_of_the_planned_ranks(tmp_path, trained):
    """What a 4-rank train that lost a node and goes on with 2 ranks (min_nodes) does: its DCP
    checkpoint reshards, each rank takes twice the share of the global batch (data.batch_size is the
    global batch), and the result is that of the uninterrupted 4-rank run; the history has every
    step once and both segments."""
    _, uninterrupted = trained
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(TRAIN))
    args = ("--config", "train.yaml", "--checkpoint", "ck", "--history", "train.h5")
    killed = _stage(tmp_path, "train", 4, *args, env=clean_env(PARSL_TORCH_FAULT="kill@3:13"))
    assert killed.returncode == 137 and checkpoint.read(tmp_path / "ck")["step"] == 10
    resumed = _result(_stage(tmp_path, "train", 2, *args))
    assert resumed["resumed_from"] == 10 and resumed["world_size"] == 2
    assert resumed["segments"] == [[0, 4], [10, 2]]
    assert resumed["final_loss"] == pytest.approx(uninterrupted["final_loss"], rel=1e-5)
    history = h5py.File(tmp_path / "train.h5")
    assert list(history["step"][:]) == list(range(20))
    assert json.loads(history.attrs["segments"]) == [[0, 4], [10, 2]]


def test_what_is_not_a_checkpoint_is_named(tmp_path):
    (tmp_path / "dir").mkdir()
    with pytest.raises(ValueError, match="is not a parsl-torch checkpoint"):
        checkpoint.read(tmp_path / "dir")
    (tmp_path / "dir" / "meta.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="is not a parsl-torch checkpoint"):
        checkpoint.read(tmp_path / "dir")


def test_a_directory_of_the_users_at_the_checkpoint_path_is_never_replaced(tmp_path):
    import torch

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("data")
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="is a directory that parsl-torch did not write"):
        checkpoint.save(tmp_path / "mine", model, torch.optim.SGD(model.parameters(), lr=0.1), 1, {}, None, "fsdp")
    assert (tmp_path / "mine" / "keep.txt").read_text() == "data" and not (tmp_path / "mine.steps").exists()
