"""Bad requests refused before anything runs, naming what to fix: stage names that would
leave the run directory or touch what parsl-torch did not make, a run directory that
cannot be written, seeds that overflow on the ranks, impossible site settings."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import parsl_torch as pt
from parsl_torch.errors import ConfigError, SiteError

from .conftest import BIN, clean_env

BAD_NAMES = ["../escape", "/tmp/elsewhere", ".", "..", "parsl", "a\nb", ".lock", "x" * 300, 123, "a b", "a/b"]


@pytest.mark.slow
def test_a_stage_name_is_one_safe_folder_name_and_arguments_need_an_identity(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)

    @pt.distributed_app(ranks_per_node=1)
    def noop():
        return 1

    @pt.distributed_app(ranks_per_node=1)
    def takes(cfg, opts=None):
        return cfg

    outside = set(os.listdir(tmp_path))
    with pt.workflow(site="local", run_dir=tmp_path / "runs") as wf:
        before = set(os.listdir(wf.run_dir))
        with pytest.raises(ConfigError, match=r"stage 'takes': argument 'cfg'\['lock'\] is a _thread.lock, which "
                                              r"has no stable identity for reruns: pass plain data"):
            takes({"lock": threading.Lock()})
        with open(os.devnull) as handle, pytest.raises(ConfigError, match=r"argument 'opts' is a _io.TextIOWrapper"):
            takes(1, opts=handle)
        for name in BAD_NAMES:
            with pytest.raises(ConfigError, match=r"stage= .* is not a stage name: use 1-100 letters"):
                noop(stage=name)
        with pytest.raises(ConfigError, match=r"the stage's name \(name= on the decorator or script_app\) "
                                              r"'my script' is not a stage name"):
            pt.script_app(tmp_path / "my script.py")()
        # what needs the call's ranks is refused at the call, not 3 to 5 s later on them
        from parsl_torch.stages.train import train

        small = {"model": {"vocab_size": 16, "dim": 8}, "steps": 2}
        for size in (1, 3):
            with pytest.raises(ConfigError, match=rf"stage 'train' on 1 node\(s\) x 2 rank\(s\): data.batch_size: {size} "
                                                  rf"does not split evenly into its 2 data-parallel ranks .*use a "
                                                  rf"multiple of 2"):
                train({**small, "data": {"batch_size": size}}, ranks_per_node=2)
        with pytest.raises(ConfigError, match=r"parallel: tp=3 does not fill the 2 ranks launched"):
            train({**small, "parallel": {"tp": 3, "dp_shard": 1}}, ranks_per_node=2)
        # these three were refused only on the ranks, seconds later
        with pytest.raises(ConfigError, match=r"stage 'train' on 1 node\(s\) x 2 rank\(s\): pp_split: \[5\] names "
                                              r"block 5, but the model has 2 \(0 to 1\)"):
            train({**small, "parallel": {"pp": 2, "pp_split": [5]}}, ranks_per_node=2)
        with pytest.raises(ConfigError, match=r"parallel.tp: tp=2 does not divide the model's 1 attention heads"):
            train({**small, "model": {**small["model"], "n_heads": 1}, "parallel": {"tp": 2}}, ranks_per_node=2)
        with pytest.raises(ConfigError, match=r"parallel.cp: torch's context-parallel attention runs on CUDA GPUs "
                                              r"only, and the site's nodes have none: use cp: 1 here"):
            train({**small, "parallel": {"cp": 2}}, ranks_per_node=2)
        assert set(os.listdir(wf.run_dir)) == before  # nothing made, nothing renamed
    assert set(os.listdir(tmp_path)) == outside | {"runs"}


def test_a_read_only_run_directory_is_one_line_and_exit_2(tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        if os.environ.get("PARSL_TORCH_REQUIRE_CLUSTER"):  # CI runs as root: there it must run
            pytest.fail("PARSL_TORCH_REQUIRE_CLUSTER is set but a read-only mount needs root and unshare")
        pytest.skip("a read-only mount needs root and unshare")
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


ERROR_MIDWAY = """
import pathlib, sys, time
import parsl_torch as pt

@pt.distributed_app(ranks_per_node=1)
def slow(seconds):
    time.sleep(seconds)
    if pt.get_rank() == 0:
        pathlib.Path("done.txt").write_text("done")
    return seconds

@pt.distributed_app(ranks_per_node=1)
def after(x):
    return x

with pt.workflow(site="local", run_dir="runs", on_error=sys.argv[1]):
    first = slow(8)
    while not pathlib.Path("runs/slow/.started").exists():
        time.sleep(0.1)
    after(first)  # waits for slow: it must never start once the script raised
    raise ValueError("bad config in a later stage")
"""


@pytest.mark.slow
@pytest.mark.parametrize("on_error", ["wait", "cancel"])
def test_an_error_in_the_script_keeps_the_running_stages_work_or_stops_it_as_asked(tmp_path, on_error):
    (tmp_path / "wf.py").write_text(ERROR_MIDWAY)
    out = subprocess.run([sys.executable, "wf.py", on_error], cwd=tmp_path, capture_output=True, text=True,
                         env=clean_env(), timeout=180)
    assert out.returncode == 1 and "ValueError: bad config in a later stage" in out.stderr
    said = "the workflow script raised ValueError: bad config in a later stage"
    assert said in out.stderr
    assert not (tmp_path / "runs" / "after" / ".started").exists(), "a stage started after the error"
    if on_error == "wait":
        assert "waiting for the running stage(s) slow to finish" in out.stderr
        assert out.stderr.index(said) < out.stderr.index("[slow] done"), "the error was not shown at once"
        assert (tmp_path / "runs" / "slow" / "done.txt").read_text() == "done"
    else:
        assert "waiting for" not in out.stderr
        time.sleep(8)  # as long as the stage would have taken: nothing of it may still be running
        assert not (tmp_path / "runs" / "slow" / "done.txt").exists()


def test_a_number_yaml_reads_as_text_says_how_to_write_it(tmp_path, monkeypatch):
    from parsl_torch import sites

    (tmp_path / "g.yaml").write_text("name: g\nscheduler: slurm\nprovider: {walltime: '01:00:00', "
                                     "grace_period: 1.0e308}\n")
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(tmp_path))
    with pytest.raises(SiteError, match=r"provider.grace_period: expected .*got str '1.0e308' \(YAML reads it as "
                                        r"text: write 1.0e\+308\)"):
        sites.load("g")


TAKER = """
import socket, sys, time
from pathlib import Path
from parsl_torch.common import runlock
from parsl_torch.errors import ConfigError

judge = runlock.RunLock._stale
def slow_judge(holder, age):  # both takers judge the lock stale before either acts on it
    decision = judge(holder, age)
    time.sleep(1.0)
    return decision
runlock.RunLock._stale = staticmethod(slow_judge)
try:
    with runlock.RunLock(Path(sys.argv[1])):
        print("held", flush=True)
        time.sleep(3)
except ConfigError as exc:
    print("refused", exc, flush=True)
"""


def test_of_two_workflows_taking_over_one_stale_lock_exactly_one_wins(tmp_path):
    import json
    import socket

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout),
                                                "since": "earlier"}))
    (tmp_path / "taker.py").write_text(TAKER)
    takers = [subprocess.Popen([sys.executable, str(tmp_path / "taker.py"), str(tmp_path)], stdout=subprocess.PIPE,
                               text=True, env=clean_env()) for _ in range(2)]
    said = sorted(p.communicate(timeout=60)[0].split()[0] for p in takers)
    assert said == ["held", "refused"], said


@pytest.mark.slow
def test_a_walltime_too_short_for_a_block_to_take_a_stage_fails_at_once(tmp_path):
    """It used to submit and kill block after block forever (20 blocks in 100 s, nothing said)."""
    (tmp_path / "wf.py").write_text(textwrap.dedent("""
        import parsl_torch as pt

        @pt.distributed_app(ranks_per_node=1)
        def one():
            return 1

        with pt.workflow(site="local", run_dir="runs"):
            print(one().result())
    """))
    t0 = time.monotonic()
    out = subprocess.run([str(BIN / "parsl-torch"), "run", "wf.py"], cwd=tmp_path, capture_output=True, text=True,
                         env=clean_env(PARSL_TORCH_WALLTIME="00:00:03"), timeout=120)
    assert out.returncode == 2 and time.monotonic() - t0 < 60, out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("parsl-torch: error: site 'local': walltime 00:00:03 is too short for a block to take "
                           "a stage: a block takes new stages only in its first 1 s"), line
    assert re.search(r"a worker pool needs [\d.]+ s to start here \(measured\)", line), line
    assert not (tmp_path / "runs" / "one").exists()  # nothing was submitted


def test_a_run_directory_parsl_cannot_use_is_refused_before_anything_is_made(tmp_path):
    """Parsl's providers run scripts under the run directory unquoted (a space hung the workflow forever)
    and format commands holding its path (a brace broke them)."""
    import parsl_torch as pt

    for name in ("my runs", "runs$x", "runs{1}", "a;b", "run#2", "runs?"):
        with pytest.raises(ConfigError, match=r"its path has .* which Parsl's providers pass to a shell unquoted"):
            with pt.workflow(site="local", run_dir=tmp_path / name):
                pass
        assert not (tmp_path / name).exists()


def test_an_empty_or_damaged_lock_is_a_crashs_and_is_taken_over(tmp_path):
    """A crash between creating a lock and writing it (or a full disk) left an empty one, which blocked
    the directory for 300 s as "host ?, PID ?": a lock is now written whole, so a damaged one is taken over."""
    import os
    import time

    from parsl_torch.common.runlock import LOCK, RunLock

    for content in ("", "{not json", "[1, 2]"):
        lock = tmp_path / LOCK
        lock.write_text(content)
        os.utime(lock, (time.time() - 60, time.time() - 60))
        with RunLock(tmp_path):
            assert '"token"' in lock.read_text()
        assert not lock.exists()
    lock.write_text("")  # just made: taken over once it is older than a write can take
    t0 = time.monotonic()
    with RunLock(tmp_path):
        assert time.monotonic() - t0 < 5
    assert not list(tmp_path.glob(LOCK + ".*"))  # the file the lock was linked from is gone


def test_a_damaged_status_file_is_one_clear_error(tmp_path):
    from .conftest import BIN, clean_env

    (tmp_path / "status.json").write_text('{"stages": {"train": ')
    out = subprocess.run([str(BIN / "parsl-torch"), "status", str(tmp_path)], capture_output=True, text=True,
                         timeout=60, env=clean_env())
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{tmp_path / 'status.json'} is damaged (JSONDecodeError" in out.stderr


@pytest.mark.slow
def test_a_script_that_exits_99_with_no_block_end_fails_once(tmp_path, monkeypatch):
    """99 is "continue in the next block" only where a block ends: without a block deadline it is the
    script's own exit code, a failure (the stage ran four times before)."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "bye.py"
    script.write_text("import sys\nopen('ran.txt', 'a').write('x')\nsys.exit(99)\n")
    with pt.workflow(site="local", run_dir="runs"):
        future = pt.script_app(script, ranks_per_node=1)()
        with pytest.raises(pt.StageError, match=r"rank 0 on \S+ exited with code 99 \(exit code 99 continues a stage in "
                                                r"its next block only at its block's end or through "
                                                r"pt.to_be_continued\(\): neither happened\)"):
            future.result(timeout=120)
    assert (tmp_path / "runs" / "bye" / "ran.txt").read_text() == "x"


def test_a_file_that_is_not_a_checkpoint_and_an_empty_run_dir_are_one_line_each(tmp_path, capsys):
    """`checkpoint export /etc/passwd` was a raw IndexError; `run --run-dir ""` was silently ignored."""
    from parsl_torch.cli import main as cli

    for text in ("root:x:0:0\n", "hello\n"):
        (tmp_path / "not.pt").write_text(text)
        assert cli(["checkpoint", "export", str(tmp_path / "not.pt"), str(tmp_path / "out.pt")]) == 2
        err = capsys.readouterr().err
        assert f"checkpoint export: {tmp_path / 'not.pt'} is not a parsl-torch checkpoint: torch.load cannot" in err
        assert err.count("\n") == 1 and not (tmp_path / "out.pt").exists()
    (tmp_path / "wf.py").write_text("print('ran')\n")
    assert cli(["run", "--run-dir", "", str(tmp_path / "wf.py")]) == 2
    assert "parsl-torch run: --run-dir needs a value, got an empty string" in capsys.readouterr().err


def test_script_app_runs_a_program_as_it_is_and_refuses_python_for_it(tmp_path):
    """Any executable is a script stage (a shell script, a binary), run as it is; a Python script (``.py``,
    a ``python`` "#!" line, or not executable) is run by the stage's Python, whose name says it is one."""
    from parsl_torch.apps.stage.scriptargs import script_command_length

    program = tmp_path / "prep.sh"
    program.write_text("#!/bin/sh\necho hi\n")
    program.chmod(0o755)
    assert pt.script_app(program, args=["--n", 2]).script == (str(program), "--n", 2)
    assert script_command_length((str(program), "--n", 2)) == 1
    tool = tmp_path / "tool"
    tool.write_text("#!/usr/bin/env python3\nprint(1)\n")
    tool.chmod(0o755)
    assert pt.script_app(tool).script == (sys.executable, str(tool))
    assert pt.script_app(tmp_path / "train.py").script == (sys.executable, str(tmp_path / "train.py"))
    with pytest.raises(ConfigError, match=r"prep.sh is a program, not a Python script \(it is executable and its "
                                          r"first line is not a python #! line\): leave out python="):
        pt.script_app(program, python=sys.executable)
    with pytest.raises(ConfigError, match=r"python='/opt/bin/py3'\): python= names a Python interpreter"):
        pt.script_app(tmp_path / "train.py", python="/opt/bin/py3")


def test_an_option_a_built_in_stage_does_not_take_is_named_with_those_it_takes():
    """``train(cfg, envs=...)`` was a TypeError from a dataclass; ``env=`` reaches the ranks as a function
    stage's does (test_multinode's node-memory test passes it)."""
    from parsl_torch.stages.evaluate import evaluate
    from parsl_torch.stages.train import train

    small = {"steps": 2, "model": {"dim": 16, "n_heads": 2, "n_layers": 1, "seq_len": 8}}
    with pytest.raises(ConfigError, match=r"stage 'train': 'envs': not an option of the built-in train stage "
                                          r"\(it takes stage, num_nodes, ranks_per_node, walltime, site, min_nodes, env\)"):
        train(small, envs={"A": "1"})
    with pytest.raises(ConfigError, match=r"stage 'check': 'nodes', 'ppn': not an option of the built-in evaluate"):
        evaluate({"model": small["model"]}, inputs=["model.pt"], stage="check", nodes=2, ppn=1)
