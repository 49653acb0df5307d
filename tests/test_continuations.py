"""Stages longer than a batch block: the block's end is known to every stage, ranks agree on the
step where they stop, the stage exits "to be continued" and the workflow submits it again
without using up retries, until it finishes or stops making progress."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import yaml
from parsl.app.errors import BashExitFailure

from parsl_torch import sites
from parsl_torch.apps.stage.continuation import Continuations, is_continuation
from parsl_torch.apps.session.status import StatusFile
from parsl_torch.apps.session.status import read as read_status
from parsl_torch.common import settings, stagedir
from parsl_torch.common.outcome import Cause, Outcome, write_outcome
from parsl_torch.common.blocks import (
    CONTINUE_EXIT,
    deadline_from_env,
    default_grace,
    duration_seconds,
)
from parsl_torch.common.stagedir import BLOCK as BLOCK_FILE
from parsl_torch.common.stagedir import CONTINUATION as CONTINUATION_FILE
from parsl_torch.errors import ConfigError, SiteError, StageError
from parsl_torch.launch.shim import catches
from parsl_torch.sites import build

from .conftest import BIN, REPO, clean_env

# -- the block's end and the grace period -------------------------------------------------------


def test_durations_and_the_default_grace_period():
    assert duration_seconds("01:00:00", "x") == 3600 and duration_seconds("55:00", "x") == 3300
    assert duration_seconds("90", "x") == 90
    for bad in ("", "soon", "-5", "0", "inf", "1:2:3:4", "99:99:99", "1:60:00", "5:75"):
        with pytest.raises(ConfigError, match="--deadline: .* HH:MM:SS"):
            duration_seconds(bad, "--deadline")
    assert default_grace(3600) == 180  # 5% of an hour
    assert default_grace(600) == 120  # at least 2 minutes
    assert default_grace(30) == 10  # but at most a third of a short block
    assert deadline_from_env({"PARSL_TORCH_BLOCK_END": "1000", "PARSL_TORCH_GRACE": "60"}) == 940
    assert deadline_from_env({settings.DEADLINE.name: "500", "PARSL_TORCH_BLOCK_END": "1000"}) == 500
    assert deadline_from_env({}) is None


def test_a_site_with_a_walltime_tells_its_blocks_when_they_end_and_drains_them_at_the_deadline():
    local = sites.load("local", walltime="00:00:30")
    init = build.worker_init(local.spec)
    assert 'export PARSL_TORCH_BLOCK_END="$(( $(date +%s) + 30 ))" PARSL_TORCH_GRACE=10' in init
    mpi = build.mpi_executor(local.spec)
    assert mpi.drain_period == 15  # half a grace period before the deadline
    # no scheduler ends a local block: `timeout` does
    assert mpi.provider.launcher("process_worker_pool.py --x", 1, 1).startswith("timeout --kill-after=10 30 ")
    # the local site has no walltime unless given one: no end, no drain
    plain = sites.load("local", env={})
    assert "PARSL_TORCH_BLOCK_END" not in build.worker_init(plain.spec)
    assert build.mpi_executor(plain.spec).drain_period is None
    # Slurm says when its job ends (23.02+); else start + walltime
    slurm = sites.load("frontier", account="abc", walltime="02:00:00", env={})
    assert '"${SLURM_JOB_END_TIME:-$(( $(date +%s) + 7200 ))}" PARSL_TORCH_GRACE=360' in build.worker_init(slurm.spec)


@pytest.mark.parametrize("provider, message", [
    ({"walltime": None}, "provider.walltime: required for scheduler slurm"),
    ({"grace_period": 3600}, r"provider.grace_period: 3600 s must be > 0 and less than the walltime \(3600 s\)"),
    ({"grace_period": 0}, "provider.grace_period: 0 s must be > 0"),
    ({"walltime": "00:00:00"}, "provider.walltime: '00:00:00' is no time at all"),
])
def test_bad_block_times_are_refused_naming_the_field(tmp_path, provider, message):
    site = {"name": "mine", "scheduler": "slurm", "provider": {"account": "a", "walltime": "01:00:00", **provider}}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(site))
    with pytest.raises(SiteError, match=message):
        sites.load("mine", env={"PARSL_TORCH_SITE_PATH": str(tmp_path)})


# -- the workflow's side: continuations are free, failures are not ------------------------------


def _record(task_id=1):
    return {"id": task_id}


def test_continuations_cost_nothing_until_a_stage_stops_making_progress(tmp_path):
    status = StatusFile(tmp_path, "local")
    failures = []
    handler = Continuations(status, max_continuations=1, then=lambda e, r: failures.append(e) or 7.0)
    stage_dir = tmp_path / "train"
    stage_dir.mkdir()
    handler.watch(1, "train", stage_dir)
    ended = BashExitFailure("stage_command", CONTINUE_EXIT)

    def block_ends_at(step, block):
        stagedir.write(stage_dir / CONTINUATION_FILE, stagedir.ContinuationRecord("c", time.time(), step, 9, 3))
        stagedir.write(stage_dir / BLOCK_FILE, stagedir.BlockRecord(block, None, None, time.time()))
        write_outcome(stage_dir, Outcome(Cause.CONTINUED, CONTINUE_EXIT, "stopped for the block's end"))
        return handler(ended, _record())

    assert block_ends_at(40, "0") == 0 and block_ends_at(80, "1") == 0  # progress: free
    row = read_status(tmp_path)[1][0]
    assert (row.state, row.progress) == ("waiting", "to continue in the next block from step 80 (2 block ends)")
    assert block_ends_at(80, "2") == 0  # one block without progress is allowed here
    with pytest.raises(StageError, match=r"end of 2 blocks in a row without progress \(checkpoint at step 80\); "
                                         r"its last checkpoint took 9 s, longer than the grace period of 3 s: "
                                         r"raise the site provider.grace_period"):
        block_ends_at(80, "3")
    # a real failure goes to the user's handler; another task's too
    crash = BashExitFailure("stage_command", 1)
    assert handler(crash, _record()) == 7.0 and handler(ended, _record(2)) == 7.0 and len(failures) == 2
    assert Continuations(status)(crash, _record()) == 1.0  # Parsl's default cost
    # exit 99 that its supervisor did not call a block's end (no block ends: a script's own 99) is a failure
    write_outcome(stage_dir, Outcome(Cause.RANK_FAILED, CONTINUE_EXIT, "rank 0 on vm exited with code 99", 0, "vm"))
    own = Continuations(status, then=lambda e, r: 5.0)
    own.watch(1, "train", stage_dir)
    assert own(ended, _record()) == 5.0


def test_a_lost_block_is_a_continuation_only_after_the_stage_deadline(tmp_path):
    class ManagerLost(Exception):
        pass

    stagedir.write(tmp_path / BLOCK_FILE, stagedir.BlockRecord("0", None, time.time() + 60, time.time()))
    assert not is_continuation(ManagerLost(), tmp_path)
    stagedir.write(tmp_path / BLOCK_FILE, stagedir.BlockRecord("0", None, time.time() - 1, time.time()))
    assert is_continuation(ManagerLost(), tmp_path)
    assert not is_continuation(RuntimeError(), tmp_path)


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_max_continuations_must_be_a_count(tmp_path, value):
    import parsl_torch as pt

    with pytest.raises(ConfigError, match=r"max_continuations=.* an int >= 0"):
        with pt.workflow(site="local", run_dir=tmp_path / "run", max_continuations=value):
            pass


# -- the ranks' side -------------------------------------------------------------------------


def test_the_shim_signals_only_a_rank_that_catches_sigusr1():
    catching = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; "
                                 "signal.signal(signal.SIGUSR1, lambda *a: None); print(flush=True); time.sleep(30)"],
                                stdout=subprocess.PIPE)
    plain = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE)
    try:
        catching.stdout.readline(), plain.stdout.readline()
        assert catches(catching.pid, signal.SIGUSR1) and not catches(plain.pid, signal.SIGUSR1)
    finally:
        catching.kill(), plain.kill()


AGREE = """
import os, sys, time
import parsl_torch as pt
pt.setup_torch()
rank = pt.get_rank()
if os.environ.get("SIGNAL_ONLY"):
    os.environ.pop("PARSL_TORCH_DEADLINE")  # the clock cannot tell this rank: only the shim's SIGUSR1
for call in range(3000):
    time.sleep(0.005 * (1 + rank))  # ranks at different speeds
    if pt.should_checkpoint():
        break
sys.stdout.write(f"rank {rank} stopped at call {call}\\n")
pt.to_be_continued(step=call)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["deadline", "signal"])
def test_ranks_agree_on_the_call_where_they_stop_and_launch_exits_to_be_continued(tmp_path, how):
    (tmp_path / "agree.py").write_text(AGREE)
    env = clean_env(SIGNAL_ONLY="1" if how == "signal" else "")
    out = subprocess.run([str(BIN / "parsl-torch"), "launch", "-n", "3", "--deadline", "6", "--", sys.executable,
                          "agree.py"], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert out.returncode == CONTINUE_EXIT, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if "stopped at call" in line]  # (torch 2.8's gloo prints too)
    stops = {line.split()[-1] for line in lines}
    assert len(lines) == 3 and len(stops) == 1 and int(stops.pop()) > 0, out.stdout
    assert "stopped for the block's end; the stage continues in the next block" in out.stderr


@pytest.mark.slow
def test_a_sigterm_after_the_deadline_is_the_block_ending(tmp_path):
    """The scheduler ends the block while the ranks still run (a save longer than the grace period):
    the launch stops them and says "to be continued", so the workflow counts it as such."""
    script = "import time; print('up', flush=True); time.sleep(60)"
    before = subprocess.Popen([str(BIN / "parsl-torch"), "launch", "-n", "1", "--deadline", "600", "--",
                               sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=clean_env())
    after = subprocess.Popen([str(BIN / "parsl-torch"), "launch", "-n", "1", "--deadline", "1", "--",
                              sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=clean_env())
    for proc in (before, after):
        assert proc.stdout.readline().strip() == "up"
    time.sleep(1.5)
    for proc in (before, after):
        proc.send_signal(signal.SIGTERM)
    assert before.wait(timeout=60) == 128 + signal.SIGTERM
    assert after.wait(timeout=60) == CONTINUE_EXIT, after.stderr.read()
    assert "after the deadline: the block is ending" in after.stderr.read()


# -- whole workflows: a stage longer than its block ------------------------------------------

LONG_TRAIN = """
import json, sys
import parsl_torch as pt
from parsl_torch.stages.evaluate import evaluate
from parsl_torch.stages.train import train

model = {"dim": 64, "n_heads": 4, "n_layers": 2, "seq_len": 32}
site, walltime, run_dir, steps = sys.argv[1:5]
with pt.workflow(site=site, run_dir=run_dir, walltime=walltime):
    t = train({"steps": int(steps), "checkpoint_every": 1000, "log_every": 100, "model": model,
               "data": {"batch_size": 16}},
              outputs=["train.h5", "model.pt"])
    e = evaluate({"model": model, "batches": 4}, inputs=[t.outputs[1]], outputs=["eval.h5"])
    print(json.dumps({"train": t.result(), "eval": e.result()}, default=str))
"""


@pytest.mark.slow
@pytest.mark.alone
def test_a_train_stage_longer_than_its_blocks_finishes_in_several_with_every_step_once(tmp_path):
    """At least 30 s of training (rank 0 takes 0.15 s longer every step, on any machine) in 30 s blocks
    (10 s grace: ~15 s of training each). In Slurm jobs: test_multinode's 2-node stage across jobs."""
    site, walltime, steps = "local", "00:00:30", 200
    (tmp_path / "long.py").write_text(LONG_TRAIN)
    run_dir = tmp_path / "run"
    env = clean_env(PARSL_TORCH_SITE_PATH=str(REPO / "tests" / "sites"), PARSL_TORCH_FAULT="slow@0:0.15")
    out = subprocess.run([sys.executable, str(tmp_path / "long.py"), site, walltime, str(run_dir), str(steps)],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    stage = run_dir / "train"
    attempts = sorted(stage.glob("stderr*.txt"), key=lambda p: int(p.name.split(".")[1]) if p.name.count(".") == 2
                      else 1 << 30)  # stderr.1.txt, stderr.2.txt, ... then this attempt's stderr.txt
    ends = re.findall(r"\[train\] block (\S+) ended at step \d+: continuing in the next block", out.stderr)
    assert len(attempts) >= 2 and len(set(ends)) == len(ends) == len(attempts) - 1, out.stderr[-3000:]
    # each continuation resumed from the last checkpoint a block wrote at its deadline (on a busy machine a
    # block can end before its ranks got to resume: that attempt saves nothing, the next resumes the same)
    saved, resumed = None, 0
    for attempt in attempts:
        text = attempt.read_text()
        # (from node memory, which holds the state of every checkpoint, or from the file)
        if saved is not None and re.search(rf"resumed from (the checkpoint of|the state kept in node memory at) "
                                           rf"step {saved} ", text):
            resumed += 1
        else:
            assert saved is None or "resumed from" not in text, (saved, attempt.name, text[-2000:])
        if found := re.search(r"checkpoint of step (\d+) saved, to be continued", text):
            saved = found.group(1)
    assert resumed >= 1
    assert 0 < result["train"]["resumed_from"] < steps and result["eval"]["trained_steps"] == steps
    with h5py.File(stage / "train.h5") as f:
        assert np.array_equal(f["step"][:], np.arange(steps))  # every step exactly once
        assert np.isfinite(f["loss"][:]).all()
    status = subprocess.run([str(BIN / "parsl-torch"), "status", str(run_dir)], capture_output=True, text=True,
                            env=env, timeout=600)
    assert "[train] done continued in block " in status.stdout
    n_ends = len(ends)
    assert f"({n_ends} block end{'s' if n_ends > 1 else ''}); step {steps}/{steps}" in status.stdout, status.stdout


NO_PROGRESS = """
import sys
import parsl_torch as pt

@pt.distributed_app
def stuck():
    pt.to_be_continued(step=0)  # never gets past step 0

with pt.workflow(site="local", run_dir=sys.argv[1], max_continuations=1):
    stuck().result()
"""


@pytest.mark.slow
def test_a_stage_that_makes_no_progress_stops_after_max_continuations(tmp_path):
    (tmp_path / "stuck.py").write_text(NO_PROGRESS)
    out = subprocess.run([str(BIN / "parsl-torch"), "run", str(tmp_path / "stuck.py"), str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=300, env=clean_env(), cwd=tmp_path)
    assert out.returncode == 1
    assert ("stage 'stuck' reached the end of 2 blocks in a row without progress (checkpoint at step 0): give its "
            "blocks a longer walltime, or pt.workflow(max_continuations=...) (now 1)") in out.stderr, out.stderr[-2000:]
    assert len(list((tmp_path / "run" / "stuck").glob("stderr*.txt"))) == 3  # progress to 0, then twice none


def test_a_save_longer_than_the_grace_period_is_warned_about_and_recorded(tmp_path, monkeypatch, capfd):
    from parsl_torch.core.deadline import note_checkpoint

    monkeypatch.setenv("PARSL_TORCH_GRACE", "30")
    monkeypatch.setenv("PARSL_TORCH_STAGE_DIR", str(tmp_path))
    note_checkpoint(40, 12.0)
    assert "longer than the grace period" not in capfd.readouterr().err
    note_checkpoint(80, 95.0)
    assert ("the checkpoint of step 80 took 95 s, longer than the grace period of 30 s: a block may end before the "
            "last save is written; raise the site's provider.grace_period") in capfd.readouterr().err
    record = json.loads((tmp_path / CONTINUATION_FILE).read_text())
    assert (record["step"], record["save_seconds"], record["grace"]) == (80, 95.0, 30.0)


# -- big checkpoints: the stop comes early enough for the save --------------------------------


def test_a_stage_whose_saves_outgrow_the_grace_period_stops_early_enough(tmp_path, monkeypatch, capfd):
    from parsl_torch.core import deadline as ranks_side
    from parsl_torch.core.ranks import rank_state

    end = time.time() + 1000
    for var, value in {"PARSL_TORCH_BLOCK_END": f"{end}", "PARSL_TORCH_GRACE": "10", "PARSL_TORCH_CALL_ID": "c1",
                       "PARSL_TORCH_STAGE_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv(settings.DEADLINE.name, raising=False)
    monkeypatch.setattr(rank_state(), "deadline", None)
    assert ranks_side.deadline() == pytest.approx(end - 10)  # a quick save: the grace period
    for _ in range(5):  # steps of ~20 ms
        assert not ranks_side.should_checkpoint()
        time.sleep(0.02)
    ranks_side.note_checkpoint(40, 40.0)  # a save longer than the grace period
    stop = ranks_side.deadline()
    assert end - 40 * 1.25 - 1 < stop < end - 40 * 1.25  # the save and two steps, with a margin
    ranks_side.deadline()
    err = capfd.readouterr().err
    assert err.count("stopping 50 s before the block's end, not the grace period's 10 s: a checkpoint takes "
                     "40.0 s and a step 0.0 s") == 1, err
    # the next block of this call knows the save time from the start; another call's does not
    monkeypatch.setattr(rank_state(), "deadline", None)
    assert ranks_side.deadline() == pytest.approx(end - 50)
    monkeypatch.setenv("PARSL_TORCH_CALL_ID", "c2")
    monkeypatch.setattr(rank_state(), "deadline", None)
    assert ranks_side.deadline() == pytest.approx(end - 10)
    ranks_side._record({"step": 3})  # another call's record is replaced, not merged
    assert json.loads((tmp_path / CONTINUATION_FILE).read_text())["step"] == 3
    assert json.loads((tmp_path / CONTINUATION_FILE).read_text())["save_seconds"] is None


BIG_SAVE = """
import os, sys, time
import parsl_torch as pt
from parsl_torch.core.deadline import note_checkpoint
pt.setup_torch()
end = float(os.environ["PARSL_TORCH_BLOCK_END"])
for step in range(100000):
    time.sleep(0.05)
    if step == 5:
        time.sleep(4)  # a periodic checkpoint that takes 4 s, with a grace period of 1 s
        note_checkpoint(step, 4.0)
    if pt.should_checkpoint():
        time.sleep(4)  # the checkpoint at the stop
        sys.stdout.write(f"rank {pt.get_rank()} saved {end - time.time():.2f} s before the block's end\\n")
        pt.to_be_continued(step)
"""


@pytest.mark.slow
def test_ranks_whose_checkpoint_outgrows_the_grace_period_still_save_before_the_block_ends(tmp_path):
    (tmp_path / "big_save.py").write_text(BIG_SAVE)
    env = clean_env(PARSL_TORCH_BLOCK_END=f"{time.time() + 30:.3f}", PARSL_TORCH_GRACE="1")
    out = subprocess.run([str(BIN / "parsl-torch"), "launch", "-n", "2", "--", sys.executable, "big_save.py"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert out.returncode == CONTINUE_EXIT, out.stdout + out.stderr[-2000:]
    margins = [float(m) for m in re.findall(r"saved (-?[\d.]+) s before the block's end", out.stdout)]
    assert len(margins) == 2 and min(margins) > 0, out.stdout  # with the grace period alone: ~3 s too late
    assert "not the grace period's 1 s: a checkpoint takes 4.0 s" in out.stderr
