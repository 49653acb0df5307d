"""Bad requests refused before anything runs, naming what to fix: stage names that would
leave the run directory or touch what parsl-torch did not make, a run directory that
cannot be written, seeds that overflow on the ranks, impossible site settings."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import parsl_torch as pt
from parsl_torch.errors import ConfigError, SiteError

from .conftest import BIN, clean_env

BAD_NAMES = ["../escape", "/tmp/elsewhere", ".", "..", "parsl", "a\nb", ".lock", "x" * 300, 123, "a b", "a/b"]


@pytest.mark.slow
def test_a_stage_name_is_one_safe_folder_name(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)

    @pt.distributed_app(ranks_per_node=1)
    def noop():
        return 1

    outside = set(os.listdir(tmp_path))
    with pt.workflow(site="local", run_dir=tmp_path / "runs") as wf:
        before = set(os.listdir(wf.run_dir))
        for name in BAD_NAMES:
            with pytest.raises(ConfigError, match=r"stage= .* is not a stage name: use 1-100 letters"):
                noop(stage=name)
        with pytest.raises(ConfigError, match=r"the stage's name \(name= on the decorator or script_app\) "
                                              r"'my script' is not a stage name"):
            pt.script_app(tmp_path / "my script.py")()
        assert set(os.listdir(wf.run_dir)) == before  # nothing made, nothing renamed
    assert set(os.listdir(tmp_path)) == outside | {"runs"}


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a read-only mount needs root")
def test_a_read_only_run_directory_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "wf.py").write_text(textwrap.dedent("""
        import parsl_torch as pt
        with pt.workflow(site="local", run_dir="runs"):
            pass
    """))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / ".parsl-torch-run").touch()  # an earlier run's directory
    runs = tmp_path / "runs"
    script = (f"mount --bind {runs} {runs} && mount -o remount,ro,bind {runs} && "
              f"exec {BIN / 'parsl-torch'} run wf.py")
    out = subprocess.run(["unshare", "--mount", "sh", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         env=clean_env(), timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"parsl-torch: error: cannot write run directory {runs} (Read-only file system): make it writable or pick "
        f"another --run-dir (nothing there was touched)"]


def test_seeds_that_overflow_on_the_ranks_are_refused_naming_the_field():
    from parsl_torch.stages.config import load_config
    from parsl_torch.stages.train import TrainConfig

    with pytest.raises(ConfigError, match=r"stage 'train': config: seed: must be between 0 and 4294967295"):
        load_config({"seed": 2**70}, TrainConfig, "train")
    with pytest.raises(ConfigError, match=r"data\.seed: must be between 0 and 4294967295 .* got 1732484000000000000"):
        load_config({"data": {"seed": 1732484000000000000}}, TrainConfig, "train")
    assert load_config({"seed": 2**32 - 1}, TrainConfig, "train").seed == 2**32 - 1


def test_a_relative_data_path_means_the_callers(tmp_path, monkeypatch):
    import numpy as np

    from parsl_torch.stages.config import load_config
    from parsl_torch.stages.train import TrainConfig

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "t.npy", np.arange(100) % 7)
    cfg = load_config({"data": {"kind": "file", "path": "data/t.npy"}, "model": {"vocab_size": 8}}, TrainConfig,
                      "train")
    assert cfg.data.path == str(tmp_path / "data" / "t.npy")


def test_impossible_local_slots_are_refused(tmp_path, monkeypatch):
    from parsl_torch import sites

    (tmp_path / "big.yaml").write_text("name: big\nscheduler: local\nlocal_slots: 1000000000\n")
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(tmp_path))
    with pytest.raises(SiteError, match="local_slots: at most 1024 stages can run at once"):
        sites.load("big")
