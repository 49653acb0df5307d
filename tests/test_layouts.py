"""Parallel layouts: the record and its refusals (fast), and real 2-, 4- and 8-rank jobs over gloo
whose loss curves follow the one-process run; a checkpoint of one layout resumed under others."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from parsl_torch.core.layout import Layout, from_strategy
from parsl_torch.errors import ConfigError
from parsl_torch.stages.config import load_config
from parsl_torch.stages.train import TrainConfig

from .conftest import RANKS_DIR, clean_env, launch, torch_version

SUITE = str(RANKS_DIR / "layout_suite.py")


# --- the record -------------------------------------------------------------------------------

def test_ranks_are_laid_out_pp_outermost_and_tp_innermost():
    layout = Layout(pp=2, tp=2)  # dp_shard=-1: the 2 ranks left of 8
    coords = [layout.coords(r, 8) for r in range(8)]
    assert [c.tp for c in coords] == [0, 1] * 4  # a tp pair is two adjacent ranks
    assert [c.pp for c in coords] == [0] * 4 + [1] * 4
    assert [(c.dp, c.dp_size) for c in coords] == [(0, 2), (0, 2), (1, 2), (1, 2)] * 2
    assert layout.describe(8) == "pp=2 x dp_shard=2 x tp=2"


def test_the_strategies_are_layouts():
    assert from_strategy("ddp", 4).sizes(4)["dp_replicate"] == 4
    assert from_strategy("fsdp", 4).sizes(4)["dp_shard"] == 4
    assert from_strategy("fsdp+tp", 4, 2).sizes(4) == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2}


@pytest.mark.parametrize("layout, world, local, blocks, names", [
    (Layout(pp=2, tp=2), 2, 2, 4, "does not fill the 2 ranks"),             # product != world size
    (Layout(dp_shard=3), 4, 4, 4, "dp_shard=3 does not fill the 4 ranks"),
    (Layout(tp=4), 8, 2, 4, "parallel: tp=4 x cp=1 = 4 ranks per group, but a node holds 2"),  # across nodes
    (Layout(pp=4), 4, 4, 2, "parallel: pp=4 (4 stages with 1f1b) is more stages than the model's 2 blocks"),
    (Layout(pp=2, pp_schedule="interleaved-1f1b"), 2, 2, 3, "4 stages with interleaved-1f1b"),
    (Layout(pp=2, pp_split=(4,)), 2, 2, 4, "pp_split: [4] names block 4, but the model has 4"),
])
def test_a_bad_layout_is_refused_naming_the_field(layout, world, local, blocks, names):
    with pytest.raises(ConfigError, match=re.escape(names)):
        layout.check(world, local, blocks)


@pytest.mark.parametrize("fields, names", [
    ({"tp": 0}, "tp: must be a whole number >= 1"),
    ({"dp_shard": 0}, "dp_shard: must be a whole number >= 1, or -1"),
    ({"pp_schedule": "zb"}, "pp_schedule: 'zb' is not one of gpipe, 1f1b, interleaved-1f1b"),
    ({"pp": 2, "pp_split": (1, 2)}, "pp_split: \\[1, 2\\] gives 3 stages, but pp=2"),
    ({"pp": 2, "pp_split": (0,)}, "pp_split: \\[0\\] must be increasing block numbers >= 1"),
])
def test_layout_fields_are_checked_when_built(fields, names):
    with pytest.raises(ConfigError, match=names):
        Layout(**fields)


def test_context_parallel_is_refused_without_sdpa_attention_or_off_cuda():
    from parsl_torch.core.models import MLP, Transformer
    from parsl_torch.core.parallelize import check_context_parallel

    with pytest.raises(ConfigError, match="parallel.cp: MLP does not declare context-parallel attention"):
        check_context_parallel(MLP())
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="parallel.cp: torch's context-parallel attention runs on CUDA"):
            check_context_parallel(Transformer())


def test_a_stage_keeps_its_blocks_and_the_plain_model_names():
    import torch

    from parsl_torch.core.models import MLP, Transformer
    from parsl_torch.core.pipeline import split_model, stage_blocks

    model = Transformer(vocab_size=16, dim=16, n_heads=2, n_layers=5, max_seq_len=8)
    blocks = stage_blocks(5, Layout(pp=2))
    assert blocks == [range(0, 3), range(3, 5)]
    assert stage_blocks(5, Layout(pp=2, pp_split=(1,))) == [range(0, 1), range(1, 5)]
    first, last = split_model(model, 0, blocks), split_model(model, 1, blocks)
    assert {k.split(".")[0] for k in first.state_dict()} == {"embed", "pos", "blocks"}
    assert {k.split(".")[0] for k in last.state_dict()} == {"blocks", "norm", "head"}
    assert set(first.state_dict()) | set(last.state_dict()) == set(model.state_dict())
    tokens = torch.randint(0, 16, (2, 8))
    torch.testing.assert_close(last(first(tokens)), model(tokens))  # the stages chained are the model
    # a model that does not name its ends: what is registered before the blocks goes first, after them last
    parts = [split_model(MLP(depth=4), s, stage_blocks(4, Layout(pp=2))) for s in (0, 1)]
    assert [{name for name, _ in part.named_children()} for part in parts] == [{"inp", "blocks"}, {"blocks", "out"}]


def test_train_config_parallel_section():
    cfg = load_config({"model": {"n_layers": 4}, "parallel": {"pp": 2, "pp_schedule": "GPipe"}}, TrainConfig, "train")
    assert cfg.parallel == Layout(pp=2, pp_schedule="gpipe")
    for extra, names in (({"strategy": "fsdp"}, "parallel: replaces strategy and tp_size"),
                         ({"compile": True}, "compile: a pipelined model"),
                         ({"precision": "fp16"}, "precision: fp16's gradient scaler"),
                         ({"model": {"n_layers": 1}}, "parallel.pp: 2 stages .*model.n_layers")):
        with pytest.raises(ConfigError, match=names):
            load_config({"model": {"n_layers": 4}, "parallel": {"pp": 2}, **extra}, TrainConfig, "train")
    with pytest.raises(ConfigError, match="parallel.cp: model.kind 'mlp'"):
        load_config({"model": {"kind": "mlp"}, "parallel": {"cp": 2}}, TrainConfig, "train")
    with pytest.raises(ConfigError, match="parallel.pp_schedule: 'zb'"):
        load_config({"parallel": {"pp_schedule": "zb"}}, TrainConfig, "train")


# --- real jobs --------------------------------------------------------------------------------

def curves(tmp_path, n, layouts):
    spec = ";".join(f"{name}={json.dumps(fields)}" for name, fields in layouts.items())
    out = launch("mpiexec", n, [SUITE, str(tmp_path), "curves", spec], timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]


def assert_follows_one_process(ranks, layouts):
    ref = ranks[0]["ref"]
    assert ref[-1] < ref[0] - 1.5  # the one-process run learns
    for name in layouts:
        for res in ranks:
            # the same data, seed and global batch: the same curve up to float summation order
            assert res[name]["losses"] == pytest.approx(ref, rel=1e-4), name
        # every parameter lives on some rank, under the plain model's names
        names = set().union(*(res[name]["names"] for res in ranks))
        assert {n.split(".")[0] for n in names} == {"embed", "pos", "blocks", "norm", "head"}


@pytest.mark.slow
@pytest.mark.lowest
def test_pipeline_schedules_on_two_ranks_follow_one_process(tmp_path):
    layouts = {"gpipe": {"pp": 2, "pp_schedule": "gpipe"}, "1f1b": {"pp": 2, "ac": "full"},
               "interleaved": {"pp": 2, "pp_schedule": "interleaved-1f1b", "pp_microbatches": 4},
               "custom_split": {"pp": 2, "custom_split": True}}
    ranks = curves(tmp_path, 2, layouts)
    assert_follows_one_process(ranks, layouts)
    assert [r["1f1b"]["kind"] for r in ranks] == ["PipelinedModel"] * 2
    # forward only (model.evaluate): the one-process model's loss on a held-out batch, on every rank;
    # before torch 2.9 (no forward-only schedule) refused on every rank with the version it needs
    old_torch = torch_version() < (2, 9)
    for res in ranks:
        if old_torch:
            assert "needs torch >= 2.9" in res["1f1b"]["eval_refused"]
        else:
            assert res["1f1b"]["eval"] == pytest.approx(res["1f1b"]["ref_eval"], rel=1e-4)
    assert [r["gpipe"]["coords"][0] for r in ranks] == [0, 1]  # rank 1 runs the second stage


@pytest.mark.slow
def test_pipeline_with_fsdp_and_with_tp_on_four_ranks(tmp_path):
    layouts = {"pp2_fsdp2": {"pp": 2, "dp_shard": 2, "ac": "full"},
               "pp2_tp2": {"pp": 2, "tp": 2, "pp_schedule": "interleaved-1f1b", "ac": "selective"},
               "hsdp": {"dp_replicate": 2, "dp_shard": 2, "ac": "full"}}
    ranks = curves(tmp_path, 4, layouts)
    assert_follows_one_process(ranks, {k: v for k, v in layouts.items() if k != "hsdp"})
    assert ranks[0]["hsdp"]["losses"] == pytest.approx(ranks[0]["ref"], rel=1e-4)
    assert [r["pp2_fsdp2"]["coords"][:3] for r in ranks] == [[0, 0, 2], [0, 1, 2], [1, 0, 2], [1, 1, 2]]


@pytest.mark.slow
def test_fsdp_tp_pp_on_eight_ranks(tmp_path):
    layouts = {"fsdp2_tp2_pp2": {"pp": 2, "tp": 2, "dp_shard": 2, "ac": "selective"}}
    assert_follows_one_process(curves(tmp_path, 8, layouts), layouts)


@pytest.mark.slow
def test_a_checkpoint_of_pp2_fsdp2_resumes_under_fsdp4_and_on_one_rank(tmp_path):
    ckpt = str(tmp_path / "ckpt.pt")
    runs = {}
    for name, n, mode, spec in (("saved", 4, "save", '{"pp": 2, "dp_shard": 2}'),
                                ("fsdp4", 4, "resume", '{"dp_shard": 4}'), ("one", 1, "resume", "one")):
        out_dir = tmp_path / name
        out_dir.mkdir()
        cmd = [SUITE, str(out_dir), mode, ckpt, spec]
        out = launch("mpiexec", n, cmd, timeout=600) if n > 1 else subprocess.run(
            [sys.executable, *cmd], env=clean_env(), capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        runs[name] = json.loads((out_dir / "rank0.json").read_text())
    assert runs["saved"]["kind"] == "PipelinedModel"
    # the next two steps (the model and the optimizer's state restored) give the saved run's losses
    assert runs["fsdp4"]["next"] == pytest.approx(runs["saved"]["next"], rel=1e-5)
    assert runs["one"]["next"] == pytest.approx(runs["saved"]["next"], rel=1e-5)


@pytest.mark.slow
def test_a_bad_layout_fails_every_rank_before_any_collective(tmp_path):
    """Two ranks, a layout of four: each rank says so itself and the job ends (a collective on one
    rank alone would hang it past the timeout)."""
    config = tmp_path / "bad.yaml"
    config.write_text("model: {n_layers: 4}\nsteps: 2\nparallel: {pp: 2, tp: 2}\n")
    out = launch("mpiexec", 2, ["-m", "parsl_torch.stages.train", "--config", str(config), "--history",
                                str(tmp_path / "t.h5"), "--checkpoint", str(tmp_path / "m.pt")], timeout=120)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    for r in (0, 1):
        assert f"[rank{r}]: parsl_torch.errors.ConfigError: parallel: pp=2 x tp=2 does not fill the 2 ranks" in text


@pytest.mark.slow
def test_the_train_stage_with_a_parallel_section_then_an_evaluation_on_one_rank(tmp_path):
    """configs' parallel: section on 4 ranks (pp 2 x fsdp 2, interleaved, recomputed blocks): a history
    of every step with its throughput, a sharded checkpoint that one process evaluates."""
    import parsl_torch as pt

    model = "model: {n_layers: 4, dim: 32, n_heads: 2, seq_len: 16}\n"
    (tmp_path / "train.yaml").write_text(model + "steps: 12\ncheckpoint_every: 6\nlr: 0.01\nactivation_checkpointing: "
                                         "full\nparallel: {pp: 2, pp_schedule: interleaved-1f1b}\n")
    (tmp_path / "eval.yaml").write_text(model + "batches: 2\n")
    out = launch("mpiexec", 4, ["-m", "parsl_torch.stages.train", "--config", str(tmp_path / "train.yaml"),
                                "--history", str(tmp_path / "train.h5"), "--checkpoint", str(tmp_path / "model.pt")],
                 timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    history = pt.read_history(tmp_path / "train.h5")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["world_size"] == 4 and result["final_loss"] < 3.5
    assert (tmp_path / "model.pt").is_symlink()  # sharded: every rank wrote its own stage's shards
    assert json.loads((tmp_path / "model.pt" / "meta.json").read_text())["strategy"] == "parallel: pp=2 x dp_shard=2"
    assert list(history.steps) == list(range(12))  # every step once
    assert len(history.metrics["tokens_per_s"]) == 12 and min(history.metrics["tokens_per_s"]) > 0
    ev = subprocess.run([sys.executable, "-m", "parsl_torch.stages.evaluate", "--config", str(tmp_path / "eval.yaml"),
                         "--checkpoint", str(tmp_path / "model.pt"), "--history", str(tmp_path / "eval.h5")],
                        env=clean_env(), capture_output=True, text=True, timeout=300)
    assert ev.returncode == 0, ev.stdout + ev.stderr
    assert json.loads(ev.stdout.strip().splitlines()[-1])["eval_loss"] < 3.5


@pytest.mark.slow
def test_a_pipeline_killed_resumes_from_node_memory_with_the_losses_of_an_uninterrupted_run(tmp_path):
    """pp=2 on 2 ranks, a state kept in node memory every 2 steps (each rank its own stages'), no file
    checkpoint: rank 1 is killed as step 7 starts; the stage's next launch for the same call resumes at
    step 6 from node memory, and every step's loss is bitwise that of the same training uninterrupted."""
    import numpy as np

    import parsl_torch as pt

    (tmp_path / "train.yaml").write_text("model: {n_layers: 2, dim: 32, n_heads: 2, seq_len: 16}\nsteps: 10\n"
                                         "checkpoint_every: 100\nsnapshot_every: 2\nlr: 0.01\nparallel: {pp: 2}\n")
    outs = {}
    for run, fault in (("plain", ""), ("killed", f"kill@1:7:{tmp_path / 'once'}"), ("resumed", "")):
        where = tmp_path / ("plain" if run == "plain" else "killed")
        where.mkdir(exist_ok=True)
        env = clean_env(PARSL_TORCH_CALL_ID=f"call-{where.name}", PARSL_TORCH_STAGE_DIR=str(where),
                        PARSL_TORCH_FAULT=fault)
        outs[run] = launch("mpiexec", 2, ["-m", "parsl_torch.stages.train", "--config", str(tmp_path / "train.yaml"),
                                          "--history", str(where / "train.h5"), "--checkpoint", str(where / "model.pt")],
                           env=env, timeout=300)
    assert outs["plain"].returncode == 0 and outs["killed"].returncode != 0, outs["killed"].stderr[-3000:]
    assert outs["resumed"].returncode == 0, outs["resumed"].stderr[-3000:]
    assert "resumed from the state kept in node memory at step 6 (no checkpoint file read)" in outs["resumed"].stderr
    plain, resumed = (pt.read_history(tmp_path / run / "train.h5") for run in ("plain", "killed"))
    assert list(resumed.steps) == list(range(10))
    assert np.array_equal(resumed.metrics["loss"], plain.metrics["loss"])  # bitwise


# --- on a GPU (the accelerator machine: one GPU, so one-rank layouts) ----------------------------

@pytest.mark.gpu
def test_on_one_gpu_a_layout_trains_as_the_plain_model_and_recompute_lowers_the_peak():
    """One rank: ``layout=`` gives the plain model in bf16 (with recompute where asked), whose losses
    are the plain model's; full recompute lowers the allocator's peak of a step."""
    import torch
    import torch.nn.functional as F

    import parsl_torch as pt
    from parsl_torch.core.models import Transformer

    def peak_and_losses(layout, ac):
        torch.manual_seed(0)
        net = Transformer(vocab_size=512, dim=512, n_heads=8, n_layers=8, max_seq_len=1024).cuda()
        model = pt.wrap_model(net, layout=layout, precision="bf16", activation_checkpointing=ac) \
            if layout else pt.wrap_model(net, strategy="none", precision="bf16")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        torch.cuda.reset_peak_memory_stats()
        for step in range(3):
            tokens = torch.randint(0, 512, (8, 1025), generator=torch.Generator().manual_seed(step)).cuda()
            loss = F.cross_entropy(model(tokens[:, :-1]).float().reshape(-1, 512), tokens[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        return torch.cuda.max_memory_allocated(), losses

    plain_peak, plain = peak_and_losses(None, None)
    peak, losses = peak_and_losses(pt.Layout(), "full")
    print(f"peak of a step on {torch.cuda.get_device_name()}: plain {plain_peak / 2**20:.0f} MiB, full recompute "
          f"{peak / 2**20:.0f} MiB ({peak / plain_peak:.2f}x)")
    assert losses == pytest.approx(plain, rel=2e-2)  # bf16: recompute may round differently
    assert peak < 0.8 * plain_peak
