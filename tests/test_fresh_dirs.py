"""A new call of a stage starts in an empty stage directory; a continuation of the same call keeps it.

The case from the audit: a resumable script (minGPT's ``gpt_snapshot.pt`` pattern) whose learning
rate is edited must train anew, not resume the previous call's snapshot and return its result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from parsl_torch.apps.freshdir import start_fresh
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
