"""A new call of a stage starts in an empty stage directory; a continuation of the same call keeps it.

The case from the audit: a resumable script (minGPT's ``gpt_snapshot.pt`` pattern) whose learning
rate is edited must train anew, not resume the previous call's snapshot and return its result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from parsl_torch.apps.identity.freshdir import start_fresh
from parsl_torch.common import settings
from parsl_torch.common.stagedir import ENV, PREVIOUS, PREVIOUS_PARTIAL, SOURCES

from .conftest import clean_env

# resumes from its snapshot in its working directory, as minGPT's trainer does; dies once after
# epoch 2 where the test leaves a "crash-once" file (in a folder the same in every run)
RESUMABLE = """
import json, os, sys
lr = float(sys.argv[sys.argv.index("--lr") + 1])
state = {"epoch": 0, "weight": 0.0}
if os.path.exists("gpt_snapshot.json"):
    state = json.load(open("gpt_snapshot.json"))
resumed_from = state["epoch"]
for epoch in range(state["epoch"], 4):
    state = {"epoch": epoch + 1, "weight": state["weight"] + lr}
    json.dump(state, open("gpt_snapshot.json", "w"))
    flag = os.path.join(os.environ["FLAGS"], "crash-once")
    if epoch + 1 == 2 and os.path.exists(flag):
        os.unlink(flag)
        sys.exit(3)
json.dump({"weight": state["weight"], "resumed_from": resumed_from}, open("out.json", "w"))
"""

WORKFLOW = """
import json, sys
import parsl_torch as pt

trainer = pt.script_app("resumable.py", args=["--lr", LR], ranks_per_node=1)
with pt.workflow(site="local", run_dir="runs"):
    try:
        done = trainer(outputs=["out.json"])
        done.result()
        print("RESULT", json.dumps(json.load(open(done.outputs[0].result().filepath))), flush=True)
    except pt.StageError:
        print("RESULT", json.dumps("failed"), flush=True)
"""


def _run(project: Path, lr: str) -> tuple[object, str]:
    (project / "wf.py").write_text(WORKFLOW.replace("LR", repr(lr)))
    out = subprocess.run([sys.executable, "wf.py"], capture_output=True, text=True, timeout=240,
                         env=clean_env(PYTHONHASHSEED=lr.replace(".", ""), FLAGS=str(project / "flags")),
                         cwd=project)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.split("RESULT ", 1)[1]), out.stderr


@pytest.mark.slow
def test_an_edited_resumable_script_trains_anew_and_a_continuation_of_the_same_call_resumes(tmp_path):
    (tmp_path / "resumable.py").write_text(RESUMABLE)
    stage = tmp_path / "runs" / "resumable"
    (tmp_path / "flags").mkdir()
    (tmp_path / "flags" / "crash-once").touch()
    assert _run(tmp_path, "0.5")[0] == "failed"  # died after epoch 2, its snapshot left behind
    result, log = _run(tmp_path, "0.5")  # the same call again: it continues from its own snapshot
    assert result == {"weight": 2.0, "resumed_from": 2}, log
    assert "previous call" not in log and not (stage / PREVIOUS).exists()
    result, log = _run(tmp_path, "0.25")  # the learning rate edited: a new call, trained from epoch 0
    assert result == {"weight": 1.0, "resumed_from": 0}, log
    assert f"a new call: the previous call's files go to resumable/{PREVIOUS}/" in log, log
    assert json.loads((stage / PREVIOUS / "out.json").read_text())["weight"] == 2.0  # kept, aside
    result, log = _run(tmp_path, "0.25")  # unchanged: skipped, the new result returned
    assert result == {"weight": 1.0, "resumed_from": 0} and "[resumable] skipped" in log, log


def _owned_by(stage: Path, call: str) -> None:
    stage.mkdir(parents=True, exist_ok=True)
    (stage / ENV).write_text(json.dumps({settings.CALL_ID.name: call, "SECRET": "x"}))


def test_a_new_call_moves_every_file_aside_and_a_cut_short_move_is_finished(tmp_path):
    stage = tmp_path / "train"
    _owned_by(stage, "old")
    for name in ("model.pt", "stdout.txt", "sub/ckpt.pt", f"{SOURCES}/mod.py"):
        (stage / name).parent.mkdir(parents=True, exist_ok=True)
        (stage / name).write_text(name)
    assert start_fresh(stage, "old") == []  # the same call: a continuation keeps its files
    assert start_fresh(stage, "new") == [ENV, "model.pt", "stdout.txt", "sub"]
    assert sorted(p.name for p in stage.iterdir()) == [PREVIOUS, SOURCES]  # (this attempt's shipped modules stay)
    assert (stage / PREVIOUS / "sub" / "ckpt.pt").read_text() == "sub/ckpt.pt"
    # killed in the middle of the next move: what was moved is not lost, the next attempt finishes it
    _owned_by(stage, "new")
    (stage / "model.pt").write_text("second")
    (stage / PREVIOUS_PARTIAL).mkdir()
    (stage / PREVIOUS_PARTIAL / "history.h5").write_text("moved before the kill")
    assert start_fresh(stage, "third") == [ENV, "model.pt"]
    assert sorted(p.name for p in (stage / PREVIOUS).iterdir()) == [ENV, "history.h5", "model.pt"]
    assert not (stage / PREVIOUS_PARTIAL).exists()


# a function stage that keeps a snapshot in its directory and resumes from it, as every training loop does;
# it reads data.txt by its path (not given in inputs=: observed, not part of its identity), and dies once
# after its first step where the test leaves a "crash-once" file
RESUMING_STAGE = '''
import json, os
import parsl_torch as pt

@pt.distributed_app(ranks_per_node=1)
def resumable(data: str) -> dict:
    state = {"step": 0, "total": 0.0}
    if os.path.exists("snap.json"):
        state = json.load(open("snap.json"))
    resumed_from = state["step"]
    for step in range(state["step"], 3):
        state = {"step": step + 1, "total": state["total"] + float(open(data).read())}
        json.dump(state, open("snap.json", "w"))
        flag = os.path.join(os.environ["FLAGS"], "crash-once")
        if step == 0 and os.path.exists(flag):
            os.unlink(flag)
            raise RuntimeError("dies once after its first step")
    return {"total": state["total"], "resumed_from": resumed_from}

with pt.workflow(site="local", run_dir="runs", warm=WARM):
    try:
        print("RESULT", json.dumps(resumable(os.path.abspath("data.txt")).result()), flush=True)
    except pt.StageError:
        print("RESULT", json.dumps("failed"), flush=True)
'''


@pytest.mark.slow
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_rerun_for_a_changed_read_is_a_new_computation_and_only_an_unchanged_one_resumes(tmp_path, warm):
    """Issue 86's worst case: a stage rerun because what it read changed resumed the old computation's
    snapshot and returned its result. Separate processes, other hash seeds, edits between runs."""
    (tmp_path / "flags").mkdir()
    wf = tmp_path / "wf.py"
    wf.write_text(RESUMING_STAGE.replace("WARM", str(warm)))
    data, crash = tmp_path / "data.txt", tmp_path / "flags" / "crash-once"
    runs = iter(range(10))

    def run(value: str) -> tuple[object, str]:
        if not data.exists() or data.read_text() != value:
            data.write_text(value)
        out = subprocess.run([sys.executable, "wf.py"], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                             env=clean_env(PYTHONHASHSEED=str(next(runs)), FLAGS=str(tmp_path / "flags")))
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.split("RESULT ", 1)[1]), out.stderr

    crash.touch()
    assert run("1")[0] == "failed"  # its snapshot at step 1 left behind
    with wf.open("a") as f:
        f.write("# a comment: no change of its code\n")
    result, log = run("1")  # nothing it read changed: the same computation resumes
    assert result == {"total": 3.0, "resumed_from": 1}, log
    assert "a new computation" not in log and "a new call" not in log, log
    result, log = run("2")  # what it read changed: a new computation from step 0 (it resumed step 3 before)
    assert result == {"total": 6.0, "resumed_from": 0}, log
    assert "[resumable] runs again: input " in log and "a new computation (the last one finished)" in log, log
    assert json.loads((tmp_path / "runs" / "resumable" / PREVIOUS / "snap.json").read_text())["total"] == 3.0
    crash.touch()
    assert run("5")[0] == "failed"  # a new computation (5 is read), dead after its first step
    result, log = run("7")  # its input edited since the dead one read it: not resumed (it gave 19.0 before)
    assert result == {"total": 21.0, "resumed_from": 0}, log
    assert f"a new computation ({data} changed since the unfinished one read it)" in log, log
    result, log = run("7")
    assert result == {"total": 21.0, "resumed_from": 0} and "[resumable] skipped" in log, log


# a stage in two blocks: the first reads a.txt and stops for its block's end; the next reads b.txt
TWO_BLOCKS = '''
import os, sys
import parsl_torch as pt

HERE = os.getcwd()

@pt.distributed_app(ranks_per_node=1)
def two_blocks() -> str:
    if not os.path.exists("first.txt"):
        open("first.txt", "w").write(open(os.path.join(HERE, "a.txt")).read())
        pt.to_be_continued(step=1)
    # (a warm call's environment is a cold one's: the warm parent's imports set TORCHINDUCTOR_CACHE_DIR)
    return open("first.txt").read() + open(os.path.join(HERE, "b.txt")).read() + \
        ("+inductor" if "TORCHINDUCTOR_CACHE_DIR" in os.environ else "")

@pt.distributed_app(ranks_per_node=1)
def exits_99() -> None:
    os._exit(99)  # (a library that ends the process with 99)

with pt.workflow(site="local", run_dir="runs", warm=WARM):
    print("RESULT", two_blocks().result(), flush=True)
    try:
        exits_99().result()
    except pt.StageError as exc:
        print("EXIT99", exc, flush=True)
'''


@pytest.mark.slow
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_what_every_block_of_a_stage_read_is_compared_and_an_unasked_exit_99_fails(tmp_path, warm):
    """A warm stage's record of reads was its last block's: an edit of what only its first block read was
    skipped. And a warm exit 99 was a continuation, asked for or not (cold: a failure); a warm call's
    environment had a variable a cold one's has not."""
    (tmp_path / "wf.py").write_text(TWO_BLOCKS.replace("WARM", str(warm)))
    (tmp_path / "a.txt").write_text("A")
    (tmp_path / "b.txt").write_text("B")

    def run() -> str:
        out = subprocess.run([sys.executable, "wf.py"], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                             env=clean_env())
        assert out.returncode == 0, out.stderr[-3000:]
        assert "exited with code 99 (exit code 99 continues a stage in its next block only at its block's end or " \
               "through pt.to_be_continued(): neither happened)" in out.stdout.split("EXIT99 ", 1)[1], out.stdout
        return out.stdout.split("RESULT ", 1)[1].split()[0] + ("/skipped" if "[two_blocks] skipped" in out.stderr else "")

    assert run() == "AB"
    assert run() == "AB/skipped"
    (tmp_path / "a.txt").write_text("A2")  # read by its first block only
    assert run() == "A2B"
