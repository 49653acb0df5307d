"""Reruns that are never stale nor another call's: the reproductions of issue 13,
run as a user runs them (a workflow script, rerun with edits, in one run directory)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .conftest import clean_env

pytestmark = pytest.mark.slow

SCALE = """
import sys
import parsl_torch as pt

K = int(sys.argv[1])


@pt.distributed_app(ranks_per_node=2)
def scale(x):
    return x * K


with pt.workflow(site="local", run_dir=sys.argv[3]):
    print("result", scale(int(sys.argv[2])).result())
"""


def run(script: Path, *args: str, timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout,
                         env=clean_env(**env), cwd=script.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def result(out: subprocess.CompletedProcess) -> str:
    return next(line.split(" ", 1)[1] for line in out.stdout.splitlines() if line.startswith("result "))


def test_a_changed_global_a_new_argument_and_a_b_a_never_return_a_stale_result(tmp_path):
    script = tmp_path / "wf.py"
    script.write_text(SCALE)
    runs = str(tmp_path / "runs")
    assert result(run(script, "1", "3", runs)) == "3"
    again = run(script, "1", "3", runs)
    assert result(again) == "3" and "[scale] skipped" in again.stderr  # nothing changed
    changed = run(script, "5", "3", runs)  # the function's global K changed
    assert result(changed) == "15"
    assert "[scale] runs again: code of `scale` changed" in changed.stderr
    assert result(run(script, "5", "4", runs)) == "20"  # B
    back = run(script, "5", "3", runs)  # A again: B's files are in the stage directory
    assert result(back) == "15"
    assert "the files in scale/ are from another call of it (arguments changed)" in back.stderr
    # the same call on a node with accelerators (two, faked: this one has none): a CPU result is not a GPU one
    gpus = run(script, "5", "3", runs, CUDA_VISIBLE_DEVICES="0,1")
    assert result(gpus) == "15" and "[scale] runs again: it now runs on nodes with accelerators" in gpus.stderr


SCRIPT_STAGE = """
import sys
import parsl_torch as pt
from parsl.data_provider.files import File

with pt.workflow(site="local", run_dir=sys.argv[1]):
    up = pt.script_app("writer.py", args=[sys.argv[2]], ranks_per_node=1)(outputs=["up.txt"])
    down = pt.script_app("reader.py", ranks_per_node=1)(inputs=[up.outputs[0], File(sys.argv[3])],
                                                       outputs=["down.txt"])
    down.result()
    print("result", open(down.outputs[0].result().filepath).read())
"""
WRITER = """
import os, sys
if int(os.environ["RANK"]) == 0:
    open("up.txt", "w").write(sys.argv[1])
"""
READER = """
import os
if int(os.environ["RANK"]) == 0:
    up = open("../{up}/up.txt").read()
    extra = open("{extra}").read()
    open("down.txt", "w").write(up + "+" + extra)
"""


def test_edited_scripts_changed_inputs_and_rerun_upstreams_rerun_what_depends_on_them(tmp_path):
    extra = tmp_path / "extra.txt"
    extra.write_text("x")
    (tmp_path / "wf.py").write_text(SCRIPT_STAGE)
    (tmp_path / "writer.py").write_text(WRITER)
    (tmp_path / "reader.py").write_text(READER.format(up="writer", extra=extra))
    runs = str(tmp_path / "runs")
    wf = tmp_path / "wf.py"
    assert result(run(wf, runs, "a", str(extra))) == "a+x"
    same = run(wf, runs, "a", str(extra))
    assert result(same) == "a+x" and "[writer] skipped" in same.stderr and "[reader] skipped" in same.stderr
    extra.write_text("y")  # an input's content, same path
    changed = run(wf, runs, "a", str(extra))
    assert result(changed) == "a+y" and "[writer] skipped" in changed.stderr
    assert f"[reader] runs again: input {extra} changed" in changed.stderr
    upstream = run(wf, runs, "b", str(extra))  # the upstream runs again and writes other content
    assert result(upstream) == "b+y"
    assert f"[reader] runs again: input {tmp_path}/runs/writer/up.txt changed" in upstream.stderr
    (tmp_path / "reader.py").write_text(READER.format(up="writer", extra=extra) + "\n# only a comment\n")
    assert "[reader] skipped" in run(wf, runs, "b", str(extra)).stderr  # nothing that runs changed
    (tmp_path / "reader.py").write_text(READER.format(up="writer", extra=extra) + "\nedited = True\n")
    edited = run(wf, runs, "b", str(extra))
    assert "[reader] runs again: code of `reader.py` changed" in edited.stderr and "[writer] skipped" in edited.stderr


TRAIN = """
import sys
import parsl_torch as pt
from parsl_torch.stages.train import train

cfg = {"steps": 4, "checkpoint_every": 2, "log_every": 2, "lr": float(sys.argv[2]),
       "model": {"kind": "mlp", "vocab_size": 16, "dim": 16, "seq_len": 8}, "data": {"batch_size": 8}}
with pt.workflow(site="local", run_dir=sys.argv[1]):
    out = train(cfg, ranks_per_node=2).result()
    print("result", out["final_loss"], out["resumed_from"])
"""


def test_train_never_resumes_a_checkpoint_of_another_config(tmp_path):
    import h5py

    wf = tmp_path / "wf.py"
    wf.write_text(TRAIN)
    runs = tmp_path / "runs"
    run(wf, str(runs), "0.001")
    second = run(wf, str(runs), "0.05")
    loss, resumed = result(second).split()
    assert resumed == "0" and loss != "nan"
    # a new call starts in an empty directory: the first call's checkpoint is aside, never resumed
    assert "a new call: the previous call's files go to train/.previous/" in second.stderr, second.stderr[-3000:]
    with h5py.File(runs / "train" / "train.h5") as f:
        assert list(f["step"][:]) == [0, 1, 2, 3]
        assert set(f["lr"][:]) == {0.05}
    with h5py.File(runs / "train" / ".previous" / "train.h5") as f:
        assert set(f["lr"][:]) == {0.001}


def test_two_workflows_on_one_run_directory_the_second_fails_at_once_naming_the_first(tmp_path):
    wf = tmp_path / "wf.py"
    wf.write_text(textwrap.dedent("""
        import sys, time
        import parsl_torch as pt
        with pt.workflow(site="local", run_dir=sys.argv[1]):
            print("holding", flush=True)
            time.sleep(float(sys.argv[2]))
    """))
    runs = str(tmp_path / "runs")
    first = subprocess.Popen([sys.executable, str(wf), runs, "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=clean_env(), cwd=tmp_path)
    assert first.stdout.readline().strip() == "holding"
    t0 = time.monotonic()
    second = subprocess.run([sys.executable, str(wf), runs, "0"], capture_output=True, text=True, env=clean_env(),
                            cwd=tmp_path, timeout=60)
    assert second.returncode != 0 and time.monotonic() - t0 < 15
    assert "is in use by another workflow: host " in second.stderr and f"PID {first.pid}" in second.stderr
    first.kill()  # a crashed holder: its lock must not need hand cleanup
    first.wait()
    third = subprocess.run([sys.executable, str(wf), runs, "0"], capture_output=True, text=True, env=clean_env(),
                           cwd=tmp_path, timeout=120)
    assert third.returncode == 0, third.stderr[-2000:]
    assert not (tmp_path / "runs" / ".lock").exists()


def test_an_explicit_stage_name_already_taken_is_an_error(tmp_path, monkeypatch):
    import parsl_torch as pt
    from parsl_torch.errors import ConfigError

    monkeypatch.chdir(tmp_path)

    @pt.distributed_app(ranks_per_node=1)
    def noop():
        return 1

    with pt.workflow(site="local", run_dir="runs/names"):
        assert noop(stage="s").stage == "s"
        with pytest.raises(ConfigError, match="stage name 's' is already used"):
            noop(stage="s")
        assert noop(stage="noop-1").stage == "noop-1"
        assert noop().stage == "noop" and noop().stage == "noop-2"  # auto names skip the taken one
        with pytest.raises(ConfigError, match="'noop-2' is already used"):
            noop(stage="noop-2")


def test_progress_lines_and_status_of_a_running_then_finished_run(tmp_path):
    import yaml

    from .conftest import BIN

    repo = Path(__file__).parent.parent
    (tmp_path / "train.yaml").write_text(yaml.safe_dump({"steps": 400, "checkpoint_every": 25, "log_every": 100,
                                                         "model": {"kind": "mlp", "vocab_size": 16, "dim": 16,
                                                                   "seq_len": 8}}))
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump({"model": {"kind": "mlp", "vocab_size": 16, "dim": 16,
                                                                  "seq_len": 8}, "batches": 2}))
    run_dir = tmp_path / "run"
    env = clean_env(PARSL_TORCH_PROGRESS_EVERY="1")
    proc = subprocess.Popen([str(BIN / "parsl-torch"), "run", str(repo / "workflows" / "train_eval.py"), "--run-dir",
                             str(run_dir), "--train-config", str(tmp_path / "train.yaml"), "--eval-config",
                             str(tmp_path / "eval.yaml")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=repo)
    seen = ""
    while proc.poll() is None and "[train] running step" not in seen:
        status = subprocess.run([str(BIN / "parsl-torch"), "status", str(run_dir)], capture_output=True, text=True,
                                env=env)
        seen = status.stdout if "[train]" in status.stdout else seen
        time.sleep(0.3)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "[train] running step" in seen and "/400 loss=" in seen and "running (host" in seen
    assert "parsl-torch: progress" in err and "[train] running step" in err  # plain lines: not a terminal
    final = subprocess.run([str(BIN / "parsl-torch"), "status", str(run_dir)], capture_output=True, text=True,
                           env=env)
    assert final.returncode == 0 and "[train] done step 400/400" in final.stdout
    assert "[evaluate] done" in final.stdout and ", finished " in final.stdout


def _carrying(needle: str) -> list[str]:
    """Processes whose command line or environment mentions ``needle``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            blob = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if needle.encode() in blob:
            found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
    return found


def test_a_workflow_killed_with_sigkill_leaves_nothing_and_a_rerun_is_sound(tmp_path):
    import signal

    wf = tmp_path / "wf.py"
    wf.write_text(TRAIN.replace('"steps": 4', '"steps": int(sys.argv[3])'))
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, str(wf), str(runs), "0.001", "100000"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=clean_env(), cwd=tmp_path)
    try:
        _kill_and_check(proc, runs)
    finally:
        if proc.poll() is None:  # a failed check must not leave a 100000-step training behind
            os.kill(proc.pid, signal.SIGKILL)
    try:
        again = run(wf, str(runs), "0.001", "4", timeout=150)  # another call (steps changed): from step 0
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"rerun hung: {exc.stderr!r}\n{_carrying(str(runs))}\n"
                             + "".join(p.read_text()[-2000:] for p in (runs / "train").glob("std*"))) from None
    loss, resumed = result(again).split()
    assert resumed == "0" and loss != "nan"


def _kill_and_check(proc: subprocess.Popen, runs: Path) -> None:
    import signal

    deadline = time.monotonic() + 150
    while not list((runs / "train").glob("*.progress.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list((runs / "train").glob("*.progress.json")), "training never started"
    from parsl_torch.apps.session.watchdog import _processes, descendants

    started = descendants(proc.pid, _processes())  # Parsl's interchange renames itself: find it by parentage
    assert started, started  # at least Parsl's MPI executor's interchange (the other starts with its first app;
    # the worker pool is a grandchild that the provider's shell leaves behind: it carries the token, and the
    # run directory in its arguments, which _carrying finds)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30

    def command(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
        except OSError:  # (ended since the table was read)
            return "watchdog"

    def alive() -> list[int]:
        table = _processes()
        return [pid for pid, start in started.items() if pid in table and table[pid][1] == start
                and "watchdog" not in command(pid)]

    while (left := alive() or _carrying(str(runs))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"still running after the workflow died: {left}"


def test_the_watchdog_ends_a_dead_workflows_renamed_children_too(tmp_path):
    """A child that overwrote its environment (setproctitle, as Parsl's interchange does) carries no
    token: the watchdog still ends it when the workflow dies, and leaves a live workflow's children.
    A helper the workflow process started itself inside the block (multiprocessing's resource tracker
    carries the token) survives a normal end and dies with a dead workflow; a token carrier further
    down (a worker left by a pool) dies either way."""
    import signal

    parent = tmp_path / "parent.py"
    parent.write_text(textwrap.dedent("""
        import os, subprocess, sys, time
        from parsl_torch.apps.session import watchdog
        dog = watchdog.start(sys.argv[1])  # a token per mode: the first one's watchdog may still sweep
        # no token, and a title as Parsl's interchange sets it
        child = subprocess.Popen(["bash", "-c", "exec -a 'parsl: fake interchange' sleep 600"], env={})
        tok = {"PARSL_TORCH_WORKFLOW": sys.argv[1]}
        helper = subprocess.Popen(["sleep", "600"], env=tok)
        shell = subprocess.Popen(["bash", "-c", "sleep 600 & echo $!; wait"], env=tok, stdout=subprocess.PIPE)
        print(child.pid, helper.pid, int(shell.stdout.readline()), flush=True)
        if sys.argv[1] == "normal":
            time.sleep(2)
            watchdog.stop(dog)
            print("stopped", flush=True)
        if sys.argv[1] == "dying":  # the pipe closes while the process still looks alive, as in the
            time.sleep(2)           # moment the kernel tears a killed workflow down: not a normal end
            dog.stdin.close()
            print("stopped", flush=True)
        time.sleep(600)
    """))
    for mode in ("crash", "dying", "normal"):
        proc = subprocess.Popen([sys.executable, str(parent), mode], stdout=subprocess.PIPE, text=True,
                                env=clean_env(), cwd=tmp_path)
        child, helper, worker = map(int, proc.stdout.readline().split())

        def gone(pid: int) -> bool:
            deadline = time.monotonic() + 30
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            return not _alive(pid)

        if mode in ("crash", "dying"):
            if mode == "crash":
                time.sleep(2)  # the watchdog notes the child
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
            else:
                assert proc.stdout.readline().strip() == "stopped"
            assert gone(child), "the dead workflow's child survived"
            assert gone(helper) and gone(worker), "a dead workflow's token carrier survived"
            proc.kill()
            proc.wait()
        else:
            assert proc.stdout.readline().strip() == "stopped"
            assert gone(worker), "a token carrier below the workflow's children survived its end"
            assert _alive(child), "a live workflow's own child was killed"
            assert _alive(helper), "the workflow process's own helper (a resource tracker) was killed"
            for pid in (child, helper):
                os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait()


def _alive(pid: int) -> bool:
    from parsl_torch.common.procs import proc_stat

    stat = proc_stat(pid)
    return stat is not None and stat.state != "Z"
