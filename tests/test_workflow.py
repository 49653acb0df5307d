"""Apps and workflows end to end on the local site, with real 2-rank stages."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import parsl_torch as pt
from parsl_torch.common import settings
from parsl_torch.errors import ConfigError, StageError
from parsl_torch.stages.evaluate import evaluate
from parsl_torch.stages.train import train

from .conftest import BIN, clean_env, processes_under
from .test_launch import leftovers

REPO = Path(__file__).parent.parent
SMALL = {"steps": 40, "checkpoint_every": 20, "log_every": 10,
         "model": {"dim": 32, "n_heads": 2, "n_layers": 1, "seq_len": 16}}
SMALL_EVAL = {"model": SMALL["model"], "batches": 4}


def run_script(script, *args, env=None, timeout=400):
    return subprocess.run([str(BIN / "parsl-torch"), "run", str(script), *args], capture_output=True,
                          text=True, timeout=timeout, env=env or clean_env(), cwd=REPO)


def small_configs(tmp_path, **train_overrides):
    import yaml

    (tmp_path / "train.yaml").write_text(yaml.safe_dump({**SMALL, **train_overrides}))
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump(SMALL_EVAL))
    return ["--train-config", str(tmp_path / "train.yaml"), "--eval-config", str(tmp_path / "eval.yaml")]


#: runs of the main job under a pseudo-terminal; with rich's stream redirection it crashed in 2 of 3
TERMINAL_RUNS = 3


@pytest.mark.slow
def test_the_main_job_on_a_terminal_shows_its_stages_and_ends_cleanly(tmp_path):
    """As a user types it (``script`` gives it a pseudo-terminal): the live table, then the
    script's own table and report, every time (a first run, then reruns that skip)."""
    run_dir = tmp_path / "run"
    command = shlex.join([str(BIN / "parsl-torch"), "run", str(REPO / "workflows" / "train_eval.py"),
                          "--run-dir", str(run_dir), *small_configs(tmp_path)])
    for attempt in range(TERMINAL_RUNS):
        typescript = tmp_path / f"typescript.{attempt}"
        out = subprocess.run(["script", "-qfec", command, str(typescript)], capture_output=True, timeout=400,
                             env=clean_env(TERM="xterm-256color", COLUMNS="120"), cwd=REPO, stdin=subprocess.DEVNULL)
        screen = typescript.read_text(errors="replace")
        assert out.returncode == 0 and "Traceback" not in screen, f"run {attempt + 1}:\n{screen[-3000:]}"
        assert "Warning" not in screen, screen[-3000:]  # (the interchange's runpy warned here once)
        assert "site local, finished" in screen and "eval_acc=" in screen and "report: " in screen, screen[-3000:]
        assert "[green]" not in screen, "markup shown as text in the live table"
    assert (run_dir / "report.md").exists()


@pytest.mark.slow
@pytest.mark.lowest
def test_train_eval_workflow_then_rerun_does_no_training(tmp_path, plots):
    run_dir = tmp_path / "run"
    args = ["--run-dir", str(run_dir), *small_configs(tmp_path)]
    first = run_script(REPO / "workflows" / "train_eval.py", *args)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "[train] done in" in first.stderr and "[evaluate] done in" in first.stderr
    train_h5, ckpt, eval_h5 = run_dir / "train" / "train.h5", run_dir / "train" / "model.pt", run_dir / "evaluate" / "eval.h5"
    with h5py.File(train_h5) as f:
        assert f.attrs["status"] == "complete" and f.attrs["world_size"] == 2
        assert list(f["step"][:]) == list(range(40)) and "loss_mean" in f
    with h5py.File(eval_h5) as f:
        assert f.attrs["stage"] == "evaluate" and "eval_acc" in f
    assert ckpt.stat().st_size > 0 and (run_dir / "report.md").exists()
    assert "evaluate" in first.stdout and "eval_acc=" in first.stdout
    # the report says what ran (site, when, versions, configs), states a constant lr, plots what changes,
    # and gives the evaluation's numbers, not plots of its batches
    report = (run_dir / "report.md").read_text()
    assert "Site `local`" in report and "Versions: " in report and "torch " in report and "Config:" in report
    assert "lr = 0.003" in report and not (run_dir / "train" / "train-plots" / "lr.png").exists()
    train_part, eval_part = report.split("## evaluate")
    assert "![loss]" in train_part and "![" not in eval_part and "eval_acc=" in eval_part

    mtime = train_h5.stat().st_mtime
    again = run_script(REPO / "workflows" / "train_eval.py", *args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[train] skipped: finished in an earlier run" in again.stderr
    assert "[evaluate] skipped" in again.stderr
    assert train_h5.stat().st_mtime == mtime  # no training happened
    status = subprocess.run([str(BIN / "parsl-torch"), "status", str(run_dir)], capture_output=True, text=True)
    assert "[train] skipped" in status.stdout and "done by an earlier run" in status.stdout  # its result kept
    assert re.search(r"\[evaluate\] skipped .*; result eval_loss=\S+ eval_acc=", status.stdout), status.stdout
    best = subprocess.run([str(BIN / "parsl-torch"), "status", str(run_dir), "--sort", "eval_acc"],
                          capture_output=True, text=True)
    assert best.returncode == 0 and best.stdout.startswith("  1. evaluate  eval_acc="), best.stdout + best.stderr


@pytest.mark.slow
def test_sweep_of_three_chains_picks_the_best(tmp_path):
    out = run_script(REPO / "workflows" / "sweep.py", "--run-dir", str(tmp_path / "sweep"), "--steps", "20")
    assert out.returncode == 0, out.stderr[-3000:]
    trials = [line for line in out.stdout.splitlines() if line.startswith("sweep-")]
    assert len(trials) == 3 and all(" finished" in t or " stopped stopped at step " in t for t in trials), out.stdout
    finished = [t.split(":")[0] for t in trials if " finished" in t]
    assert finished and all((tmp_path / "sweep" / f"evaluate-{t}" / "eval.h5").exists() for t in finished)
    assert "best: lr=" in out.stdout and f"{3 - len(finished)} of 3 trials stopped early" in out.stdout


@pytest.mark.slow
def test_app_defined_in_the_workflow_script_and_script_app(tmp_path):
    # a rendezvous exported in the user's shell must not make the two concurrent stages share a port
    env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")
    out = subprocess.run([sys.executable, str(REPO / "tests" / "workflows" / "custom_app.py"), str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(l for l in out.stdout.splitlines() if l.startswith("RESULT"))
    assert "{'sum': 21.0, 'rank': 0, " in line  # (0 + 10) + (1 + 10): rank 0's return value
    # pools forked and spawned on a rank, an input named by a string where the workflow runs
    assert "'filepath': True, 'parsl_on_ranks': False, 'pools': [2.0, 4.0], 'input': 'read'}" in line
    assert line.endswith(" of 2")  # the output File, written by the ranks, read through its DataFuture
    assert (tmp_path / "r" / "rank_sum" / "sum.txt").exists()
    assert " 0 " in line.split("}")[1]  # the script stage's future: its exit code


@pytest.mark.slow
@pytest.mark.parametrize("fault, expected", [
    ("kill@1:25", r"stage 'train' failed: rank 1 on \S+ was killed by SIGKILL"),
    # the waiting rank's collective times out: its exception is the stage's error
    ("hang@1:25", r"stage 'train' failed: rank 0 on \S+ raised RuntimeError: .*[Tt]imed out.* \(exit code 1\)"),
])
def test_faults_fail_the_stage_fast_and_leave_nothing(tmp_path, fault, expected):
    import re

    run_dir = tmp_path / "run"
    env = clean_env(PARSL_TORCH_FAULT=fault, PARSL_TORCH_TIMEOUT="10")
    t0 = time.monotonic()
    out = run_script(REPO / "workflows" / "train_eval.py", "--run-dir", str(run_dir), "--retries", "0",
                     *small_configs(tmp_path), env=env)
    took = time.monotonic() - t0
    assert out.returncode == 1, out.stderr[-3000:]
    assert re.search(expected, out.stderr), out.stderr[-3000:]
    assert "--- last lines of" in out.stderr
    assert took < 120
    time.sleep(1)
    assert leftovers(str(run_dir)) == []
    # the history up to the failure is kept
    partial = run_dir / "train" / "train.h5.partial"
    assert pt.read_history(partial).steps.max() >= 19
    # parsl-torch status names the failed stage and its error line
    status = subprocess.run([str(BIN / "parsl-torch"), "status", str(run_dir)], capture_output=True, text=True)
    assert status.returncode == 1 and re.search(r"\[train\] failed .*- " + expected, status.stdout), status.stdout
    assert "[evaluate] failed" in status.stdout and "did not run: a stage it depends on failed" in status.stdout


@pt.distributed_app(ranks_per_node=1)
def stops_its_parsl_worker(pid_file):
    """Stops (SIGSTOP) the Parsl manager it runs under, as a batch job that its scheduler ends for a lost
    node takes it down before it can answer, then fails."""
    import os
    import signal
    import sys

    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read()
        if b"parsl-torch-pool" in command or b"process_worker_pool" in command:
            break
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    with open(pid_file, "w") as f:
        f.write(str(pid))
    os.kill(pid, signal.SIGSTOP)
    sys.exit(3)


@pt.distributed_app(ranks_per_node=1)
def answers():
    return 42


def test_a_settled_tasks_later_answer_goes_nowhere_and_is_not_kept_and_a_parsl_without_the_table_is_named():
    """The executor's task table (Parsl's private ``_tasks``) is replaced at start: checked there, and a task
    ended from its supervisor's outcome is remembered only until Parsl's own later word on it comes."""
    from concurrent.futures import Future

    from parsl_torch.sites.executors import SettlesEarly

    class Executor(SettlesEarly):
        pass

    executor, task = Executor(), Future()
    task.parsl_executor_task_id = 7
    executor._tasks = {7: task}
    executor._settling()
    assert executor.settle(task, RuntimeError("node lost")) and isinstance(task.exception(), RuntimeError)
    later = executor._tasks.pop(7)  # the interchange's ManagerLost, minutes later: to a future nobody holds
    assert later is not task and not later.done() and not executor._tasks.settled
    with pytest.raises(KeyError):
        executor._tasks.pop(7)  # (nothing kept for it any longer)
    with pytest.raises(ConfigError, match=r"keeps no task table \(`_tasks`, a dict\).*install the Parsl version"):
        Executor()._settling()


@pytest.mark.slow
def test_a_stage_whose_parsl_worker_cannot_answer_ends_with_its_supervisors_outcome(tmp_path, capfd):
    """Parsl's manager stopped under a stage (its heartbeat then runs out after 120 s): the stage's future
    fails with what its supervisor recorded within seconds; the answer Parsl gets once the manager
    goes on is dropped, and the next stage runs on the same block."""
    pid_file = tmp_path / "manager.pid"
    with pt.workflow(site="local", run_dir=tmp_path / "run", retries=0):
        try:
            future = stops_its_parsl_worker(str(pid_file))
            started = time.monotonic()
            with pytest.raises(StageError, match=r"stage 'stops_its_parsl_worker' failed: rank 0 on \S+ raised "
                                                 r"SystemExit: 3 \(exit code 1\)"):
                future.result(timeout=100)
            took = time.monotonic() - started
        finally:
            if pid_file.exists():
                os.kill(int(pid_file.read_text()), signal.SIGCONT)
        assert pid_file.exists()
        assert answers().result(timeout=300) == 42
    assert took < 60, f"the stage failed {took:.0f} s after its call"
    assert "its supervisor's outcome (rank 0 on" in capfd.readouterr().err


@pytest.mark.slow
def test_retry_resumes_from_the_checkpoint_without_lost_or_duplicated_steps(tmp_path):
    run_dir = tmp_path / "run"
    env = clean_env(PARSL_TORCH_FAULT=f"kill@1:30:{tmp_path / 'killed-once'}")
    out = run_script(REPO / "workflows" / "train_eval.py", "--run-dir", str(run_dir), "--retries", "1",
                     *small_configs(tmp_path), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "killed-once").exists()  # the first attempt did die
    stderr = (run_dir / "train" / "stderr.txt").read_text()
    # the state kept in node memory (at the checkpoint of step 20 too, so never older than the file): no file read
    kept = re.search(r"resumed from the state kept in node memory at step (\d+) \(no checkpoint file read\)", stderr)
    assert kept and 20 <= int(kept[1]) <= 30, stderr[-3000:]
    data = pt.read_history(run_dir / "train" / "train.h5")
    assert list(data.steps) == list(range(40))
    assert not np.isnan(data.metrics["loss"]).any()


@pytest.mark.slow
def test_a_sharded_train_killed_resumes_from_node_memory_with_the_losses_of_an_uninterrupted_run(tmp_path):
    """FSDP on 2 ranks, a state kept in node memory every 5 steps, no checkpoint file until the end: rank 1
    is killed as step 30 starts; the retry resumes at step 30 from node memory (each rank its own shard) and
    every step's loss is bitwise that of the same training uninterrupted; nothing is left in node memory."""
    cfg = {**SMALL, "strategy": "fsdp", "checkpoint_every": 1000, "snapshot_every": 5}
    script = tmp_path / "wf.py"
    script.write_text(f"""import json, sys
import parsl_torch as pt
from parsl_torch.stages.train import train

with pt.workflow(site="local", run_dir=sys.argv[1], retries=int(sys.argv[2])):
    print("RESULT " + json.dumps(train({cfg!r}, outputs=["train.h5", "model.pt"]).result()))
""")
    results = []
    for run, retries, fault in (("plain", 1, None), ("killed", 1, f"kill@1:30:{tmp_path / 'killed-once'}"),
                                ("failed", 0, f"kill@1:30:{tmp_path / 'failed-once'}")):
        out = subprocess.run([sys.executable, str(script), str(tmp_path / run), str(retries)], capture_output=True,
                             text=True, timeout=400, env=clean_env(**({"PARSL_TORCH_FAULT": fault} if fault else {})))
        if run == "failed":  # no retry: its state in node memory goes when its workflow ends
            assert out.returncode != 0 and "rank 1 on" in out.stderr, out.stderr[-3000:]
            continue
        assert out.returncode == 0, out.stderr[-3000:]
        results.append(json.loads(out.stdout.split("RESULT ", 1)[1]))
    assert (tmp_path / "killed-once").exists() and [r["resumed_from"] for r in results] == [0, 30]
    assert "at step 30 (no checkpoint file read)" in (tmp_path / "killed" / "train" / "stderr.txt").read_text()
    plain, killed = (pt.read_history(r["history"]) for r in results)
    assert list(killed.steps) == list(range(40))
    assert np.array_equal(plain.metrics["loss"], killed.metrics["loss"])  # bitwise
    import hashlib

    for run in ("plain", "killed", "failed"):  # (this test's stage directories': other tests may train meanwhile)
        where = hashlib.sha256(str(tmp_path / run / "train").encode()).hexdigest()[:16]
        assert not (Path("/dev/shm") / f"parsl-torch-{os.getuid()}" / where).exists(), "state left in node memory"


@pytest.fixture
def local_workflow(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    with pt.workflow(site="local", run_dir=tmp_path / "run") as wf:
        yield wf


@pytest.mark.slow
def test_bad_requests_fail_before_anything_runs(tmp_path, local_workflow):
    with pytest.raises(ConfigError, match=r"stage 'train': config: model\.dimm: unknown setting; did you mean 'dim'\?"):
        train({"model": {"dimm": 3}})
    with pytest.raises(ConfigError, match=r"stage 'evaluate': input file .*missing\.pt does not exist"):
        from parsl.data_provider.files import File

        evaluate(SMALL_EVAL, inputs=[File(str(tmp_path / "missing.pt"))])
    with pytest.raises(ConfigError, match=r"stage 'evaluate': input file /\S+/missing\.pt does not exist"):
        evaluate(SMALL_EVAL, inputs=["missing.pt"])  # a name: the caller's, made absolute
    with pytest.raises(ConfigError, match=r"stage 'train': num_nodes=2 but site 'local' runs on this machine only"):
        train(SMALL, num_nodes=2)
    # Parsl's File reads a name as a URL: 'train#2.h5' was the file 'train', and two such outputs one file
    with pytest.raises(ConfigError, match=r"stage 'train': output 'train#2\.h5': Parsl reads a file's name as a URL, "
                                          r"in which '#' ends the path, so the file would be 'train': name it without"):
        train(SMALL, outputs=["train#2.h5", "model.pt"])
    with pytest.raises(ConfigError, match=r"output 'ckpt:3\.pt': Parsl reads 'ckpt:' as a URL's scheme: write "
                                          r"'\./ckpt:3\.pt' for a file of that name"):
        train(SMALL, outputs=["train.h5", "ckpt:3.pt"])
    with pytest.raises(ConfigError, match=r"stage 'evaluate': input '.*model;v2\.pt': .* ';' ends the path"):
        evaluate(SMALL_EVAL, inputs=[File(str(tmp_path / "model;v2.pt"))])

    @pt.distributed_app(ranks_per_node=1)
    def rollout(env="CartPole", seed=0, *, walltime=60):  # a parameter named like a stage option
        return env, seed, walltime

    with pytest.raises(ConfigError, match=r"stage 'rollout': env= is the stage's option \(its ranks' environment "
                                          r"variables\), and rollout\(\) has a parameter 'env' too, which would "
                                          r"not get it: rename that parameter \(e\.g\. env_\), or pass its value "
                                          r"positionally"):
        rollout(env="Pendulum")
    with pytest.raises(ConfigError, match=r"walltime= is the stage's option \(its time limit\), and rollout\(\) has"):
        rollout("Pendulum", walltime=5)
    assert not (local_workflow.run_dir / "train").exists() and not (local_workflow.run_dir / "rollout").exists()


@pytest.mark.slow
def test_eval_refuses_a_checkpoint_of_another_model(tmp_path, local_workflow):
    trained = train(SMALL)
    other = {**SMALL_EVAL, "model": {**SMALL["model"], "dim": 16}}
    with pytest.raises(StageError, match=r"model\.dim=16 but checkpoint .*model\.pt holds a model with model\.dim=32"):
        evaluate(other, inputs=[trained.outputs[1]]).result()


def test_stage_outside_a_workflow_is_an_error():
    with pytest.raises(ConfigError, match="called outside a workflow"):
        train(SMALL)


@pytest.mark.slow
def test_bad_config_on_the_command_line_is_one_line_exit_2(tmp_path):
    (tmp_path / "bad.yaml").write_text("steps: many\n")
    out = run_script(REPO / "workflows" / "train_eval.py", "--run-dir", str(tmp_path / "run"),
                     "--train-config", str(tmp_path / "bad.yaml"))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith(
        f"parsl-torch: error: stage 'train': {tmp_path / 'bad.yaml'}: steps: expected int, got str 'many'")
    assert not (tmp_path / "run").exists()


def test_stage_command_adds_the_sites_binding_after_the_mpi_prefix(tmp_path):
    import json
    import stat

    from parsl_torch.apps.stage.call import StageCall
    from parsl_torch.apps.stage.options import StageOptions
    from parsl_torch.apps.stage.cold import stage_command

    opts = StageOptions(str(tmp_path), 2, 12, 600.0, (("WANDB_API_KEY", "s3cr3t"),), ("--cpu-bind", "list:1-8:9-16"))
    # (as in your own Parsl config: no verdict left its identity, the worker computes it)
    cmd = stage_command(StageCall(opts, "mpi", (), script=("python", "train.py", "--token", "t0k"), identify_on_worker=True))
    assert ("-m parsl_torch.launch.supervise --env-file .env.json --timeout 600 --in-place --ranks 24 -- "
            "$PARSL_MPI_PREFIX "
            "--cpu-bind list:1-8:9-16 ") in cmd
    assert cmd.startswith(f"cd {tmp_path} && ")
    assert cmd.endswith(f"-m parsl_torch.launch.shim --argv-file {tmp_path / '.argv.json'}")
    # the environment and the script's arguments are off the command line (Parsl echoes it into
    # stderr.txt), in private files
    assert "s3cr3t" not in cmd and "t0k" not in cmd
    env_file, argv_file = tmp_path / ".env.json", tmp_path / ".argv.json"
    assert json.loads(env_file.read_text())["WANDB_API_KEY"] == "s3cr3t"
    assert json.loads(argv_file.read_text()) == ["python", "train.py", "--token", "t0k"]
    for private in (env_file, argv_file, tmp_path / "stdout.txt", tmp_path / "stderr.txt"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private


def test_workflow_launcher_args_come_from_the_site(tmp_path, monkeypatch):
    from parsl_torch.apps.session.placement import Placement
    from parsl_torch.launch.machines import AURORA_CPU_BIND

    aurora = pt.sites.load("aurora", account="X")
    assert Placement(aurora, "mpi").ranks_per_node == 12
    assert aurora.launcher_args(12) == ("--pmi=pmix", "--cpu-bind", AURORA_CPU_BIND)
    (tmp_path / "mine.yaml").write_text("name: mine\nscheduler: local\nlaunch:\n  extra_args: [--label]\n")
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(tmp_path))
    assert pt.sites.load("mine").launcher_args(2) == ("--label",)
    assert pt.sites.load("local").launcher_args(2) == ()


def test_shipped_function_carries_the_package_by_reference():
    # a workflow-script function that uses pt.: the package travels by reference, even from a
    # source checkout, where dill would otherwise copy its modules (and their ContextVar)
    import parsl_torch.apps.session.workflow  # noqa: F401 - holds a ContextVar, which cannot be pickled
    from parsl_torch.apps.stage.options import ShippedFunction

    namespace = {"pt": pt, "__name__": "__main__"}
    exec("def scale(x):\n    return pt.get_world_size() * x\n", namespace)  # noqa: S102
    shipped = ShippedFunction.of(namespace["scale"])
    assert shipped.load()(3) == 3
    assert len(shipped.blob) < 4000, len(shipped.blob)


SCRIPT = """
import functools, json
import parsl_torch as pt

def helper(x): return x
def unused(): pass
class Data:
    @staticmethod
    def parse(text): return fmt(text)
def fmt(text): return text.strip()
def default(): pass
class Config: pass

def make(scale):
    def inner(x): return x * scale
    return inner

doubling = make(2)

def stage(path, on=default):
    return [helper(Data.parse(path)), doubling(1), json.dumps([]), (lambda: 0)(), pt.get_rank(), on]
"""


def test_a_shipped_function_brings_the_scripts_definitions_it_reaches_to_the_ranks_main():
    """What the rank puts in ``__main__`` for the call (``apps.stage.rankmain``): the script's top-level functions and
    classes that the function reaches through its globals, a class's members, closures and defaults, and the
    classes of its arguments, as they arrive by value; nothing it does not reach, no module's, no nested
    function or lambda."""
    import dill

    from parsl_torch.apps.stage.options import ShippedFunction
    from parsl_torch.apps.stage.rankmain import definitions

    namespace = {"__name__": "__main__"}
    exec(SCRIPT, namespace)  # noqa: S102 - the workflow script
    arrived = ShippedFunction.of(namespace["stage"]).load()
    assert sorted(definitions(arrived)) == ["Data", "default", "fmt", "helper", "stage"]  # (doubling: inner)
    config = dill.loads(dill.dumps(namespace["Config"]()))  # an argument, as the rank gets it
    found = definitions(arrived, ("data.txt",), {"config": config})
    assert sorted(found) == ["Config", "Data", "default", "fmt", "helper", "stage"] and found["Config"] is type(config)
    assert found["stage"] is arrived and found["fmt"]("  x ") == "x" and found["Data"].parse(" y") == "y"


def test_run_lock_names_its_holder_and_a_stale_one_is_taken_over(tmp_path, monkeypatch):
    import json
    import socket

    from parsl_torch.common import runlock

    with runlock.RunLock(tmp_path):
        holder = json.loads((tmp_path / ".lock").read_text())
        assert holder["host"] == socket.gethostname() and holder["pid"] == os.getpid()
        with pytest.raises(ConfigError, match=f"in use by another workflow: host {socket.gethostname()}, "
                                              f"PID {os.getpid()}, since "):
            runlock.RunLock(tmp_path).__enter__()
    assert not (tmp_path / ".lock").exists()
    # a dead process on this host: taken over at once
    (tmp_path / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": 2 ** 22 + 7,
                                                "started": "1", "since": "then"}))
    with runlock.RunLock(tmp_path) as lock:
        assert json.loads((tmp_path / ".lock").read_text())["token"] == lock.token
    # another host: in use while touched recently, stale after STALE_S
    (tmp_path / ".lock").write_text(json.dumps({"host": "login9", "pid": 1, "since": "then"}))
    with pytest.raises(ConfigError, match="host login9, PID 1"):
        runlock.RunLock(tmp_path).__enter__()
    old = time.time() - runlock.STALE_S - 5
    os.utime(tmp_path / ".lock", (old, old))
    with runlock.RunLock(tmp_path):
        pass


def test_input_digests_follow_content_and_can_use_stat_only(tmp_path, monkeypatch):
    from parsl_torch.apps import identity

    f, cache = tmp_path / "data.bin", tmp_path / "parsl" / identity.DIGESTS
    f.write_bytes(b"a" * 100)
    os.utime(f, (time.time() - 60, time.time() - 60))  # (one written within 2 s is not remembered)
    first = identity.file_digest(f, cache)
    assert first == identity.file_digest(f, cache) and str(f) in cache.read_text()
    f.write_bytes(b"b" * 100)
    assert identity.file_digest(f, cache) != first
    # rewritten with the same size and its old mtime put back (rsync -t, cp -p, touch -r): read again
    os.utime(f, (time.time() - 60, time.time() - 60))
    second = identity.file_digest(f, cache)
    mtime = f.stat().st_mtime_ns
    f.write_bytes(b"c" * 100)
    os.utime(f, ns=(mtime, mtime))
    assert identity.file_digest(f, cache) != second
    monkeypatch.setenv(settings.INPUT_HASH.name, "stat")
    assert identity.file_digest(f, cache).startswith("stat:")
    assert identity.file_digest(tmp_path / "nope", cache) == "missing"


def test_the_skip_decision_is_pure_and_asks_only_for_the_facts_it_needs():
    """``decide`` does no I/O of its own: its facts are given (here without a stage directory), and a skip
    never asks who owns the directory, a first run never compares outputs or reads."""
    from types import SimpleNamespace

    from parsl_torch.apps.identity.verdict import decide
    from parsl_torch.common.stagedir import CallRecord

    asked: list[str] = []

    class Facts:
        def __init__(self, **given):
            self.given = given

        def __getattr__(self, name):
            asked.append(name)
            return self.given[name]

    call, parts = SimpleNamespace(stage="s", name="s"), {"code": "c"}
    before = CallRecord("k", parts)
    same = dict(call=call, key="k", parts=parts, before=before, cached=True, spoiled=([], []))
    assert decide(Facts(**same, stale=[])).skips and not {"computation", "new_call"} & set(asked)
    again = decide(Facts(**same, stale=["input /d changed"], computation=("k~1", "the last one finished"),
                         new_call=True))
    assert (again.why, again.computation, again.anew, again.new_call, again.again) == \
        ("input /d changed", "k~1", "the last one finished", True, True)
    asked.clear()
    first = decide(Facts(call=call, key="k", parts=parts, before=None, cached=False, computation=("k", None),
                         new_call=False))
    assert first.why == "no finished run of it in this run directory" and not first.again
    assert not {"spoiled", "stale"} & set(asked)


def test_a_script_stage_is_identified_by_its_code_and_what_it_imports(tmp_path):
    from parsl_torch.apps import identity
    from parsl_torch.apps.identity import verdict
    from parsl_torch.apps.stage.options import StageOptions

    script, helper = tmp_path / "train.py", tmp_path / "helper.py"
    script.write_text("import helper\nprint(helper.X)\n")
    helper.write_text("import os\nX = os.environ.get('SEED')\n")
    cache = identity.DigestCache(None)

    def parts(walltime=None, **opts):
        o = StageOptions(str(tmp_path / "runs" / "s"), 1, 1, walltime, (), (), script=str(script), **opts)
        return {**identity.code_components(o, cache), **identity.data_components(o, identity.Arguments("args", {}, ()), [], cache)}

    first = parts()
    assert set(first) == {"code", "options", "arguments", f"module {helper}", identity.PACKAGES}
    assert first[identity.PACKAGES] == '["os"]'  # (no distribution: no package component)
    assert parts(walltime=60.0) == first and parts(import_path=("/elsewhere",)) == first  # not compared
    script.write_text("# a comment\n\nimport helper\nprint(helper.X)  # moved down\n")
    assert parts() == first
    script.write_text("import helper\nprint(helper.X + 1)\n")
    assert parts()["code"] != first["code"]
    helper.write_text("import os\nX = os.environ.get('SEED', 2)\n")
    assert parts()[f"module {helper}"] != first[f"module {helper}"]
    # the site's worker_init (its module loads: the software the ranks get) is compared, alone
    setup = parts(site_setup="module load frameworks/2025.0")
    assert setup["site setup"] != parts(site_setup="module load frameworks/2025.2")["site setup"]
    assert {k: v for k, v in setup.items() if k != "site setup"} == parts()
    # nodes with accelerators: a component of its own, absent on CPUs (their runs' identities stay as they were)
    on_gpus = parts(accelerated=True)
    assert on_gpus["accelerators"] == "yes" and {k: v for k, v in on_gpus.items() if k != "accelerators"} == parts()
    from parsl_torch.common.stagedir import CallRecord

    assert verdict.why_rerun("s", "s", CallRecord("k", parts(), {}), on_gpus, False) == \
        "it now runs on nodes with accelerators"


def test_a_stage_given_a_variable_compares_its_value_and_one_not_observed_always_runs(tmp_path):
    """A variable given with ``env=`` is known before the run (its value is compared); a stage whose ranks
    could not tell what they read (a shell script: no Python to observe) makes no skip promise."""
    from parsl_torch.apps import identity
    from parsl_torch.apps.identity import verdict
    from parsl_torch.apps.stage.call import StageCall
    from parsl_torch.apps.stage.options import StageOptions
    from parsl_torch.common.stagedir import CallRecord

    (tmp_path / "run.sh").write_text('cat "$DATA"\n')
    parts = {}
    for value in ("data.bin", "other.bin"):
        opts = StageOptions(str(tmp_path / "runs" / "s"), 1, 1, None, (("DATA", value),), (), script="run.sh")
        parts[value] = identity.stage_components(StageCall(opts, "mpi", (), script=("bash", "run.sh")), (), {},
                                                 identity.DigestCache(None))
    assert parts["data.bin"]["env DATA"] != parts["other.bin"]["env DATA"]
    unobserved = CallRecord("key", parts["data.bin"], {}, None)
    assert verdict.stale_reads(unobserved, str(tmp_path / "runs" / "s"), {}, identity.DigestCache(None)) == \
        ["what its finished run read was not observed (see the warning of that run)"]
    observed = CallRecord("key", parts["data.bin"], {}, {})
    assert verdict.stale_reads(observed, str(tmp_path / "runs" / "s"), {}, identity.DigestCache(None)) == []


@pytest.mark.slow
def test_values_that_would_reach_a_shell_are_refused_with_the_field_named(tmp_path, local_workflow):
    hello = tmp_path / "hello.py"
    hello.write_text("print('hi')\n")
    for kwargs, message in (({"env": {"X=1; touch PWNED; Y": "v"}}, "env key 'X=1; touch PWNED; Y' is not a variable"),
                            ({"walltime": "1; touch PWNED;"}, "walltime='1; touch PWNED;' must be a number"),
                            ({"walltime": float("nan")}, "walltime=nan must be a number"),
                            ({"walltime": -1}, "walltime=-1 must be a number")):
        with pytest.raises(ConfigError, match=re.escape(message) if "=" in message else message):
            pt.script_app(hello, **kwargs)()
    assert not (tmp_path / "PWNED").exists()


#: a token in the code of this module (path-like, as base64 and JWTs are): never written by a run
MODULE_SECRET = "MODSECRET42/eyJhbGciOi.J9"


@pytest.mark.slow
def test_secrets_given_to_a_stage_are_in_no_file_a_run_writes_but_its_private_ones(tmp_path, monkeypatch):
    """A secret in a stage's arguments, in its environment and in the module of its code (a literal, which
    the stage's identity reads), a failing stage: grep every file the run wrote (parsl.log included) and
    the error text; only the 0600 call files may hold them."""
    import stat

    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")

    @pt.distributed_app(ranks_per_node=2, env={"WANDB_API_KEY": "ENVSECRET42"})
    def leaky(cfg, api_key):  # its message holds the argument named a secret, and the variable's value cut short
        raise RuntimeError(f"bad config keys: {sorted(cfg)}; login with {api_key} or {os.environ['WANDB_API_KEY'][:8]}"
                           f"... failed")

    @pt.distributed_app(ranks_per_node=1)
    def hands_back(token):
        return {"token": token}

    with pytest.raises(StageError) as failed:
        with pt.workflow(site="local", run_dir=tmp_path / "run"):
            assert hands_back("RETSECRET42").result() == {"token": "RETSECRET42"}
            leaky({"wandb_api_key": "ARGSECRET42", "lr": 0.1}, "APISECRET42").result()
    # the exception is named first, whatever the tail of stderr holds (the launcher's banners, a retry)
    assert re.match(r"stage 'leaky' failed: rank [01] on \S+ raised RuntimeError: bad config keys: \['lr', "
                    r"'wandb_api_key'\]; login with \*\*\* or \*\*\*\.\.\. failed \(exit code 1\)\n",
                    str(failed.value)), str(failed.value)
    private = {"payload.pkl", ".env.json", "result.pkl", "stderr.txt"}  # (stderr.txt: the traceback it printed)
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            if path.name in private:
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
            else:
                assert not any(s in data for s in (b"ARGSECRET42", b"ENVSECRET42", b"ENVSECRE", b"APISECRET42",
                                                   b"RETSECRET42")), path
                assert MODULE_SECRET.encode() not in data, path
    assert "SECRET42" not in str(failed.value) and "ENVSECRE" not in str(failed.value)
    assert (tmp_path / "run" / "parsl").is_dir()


@pytest.mark.slow
def test_secrets_in_a_scripts_arguments_stay_off_command_lines_and_out_of_every_file(tmp_path, monkeypatch):
    """Only the script's own process has them in its argv: not the supervisor, mpiexec or the shim
    (read from /proc while it runs), no file the run wrote but the 0600 ones, not the error."""
    import stat
    import threading

    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    script = tmp_path / "leaky.py"
    script.write_text("import sys, time\ntime.sleep(3)\nprint('failing with', sys.argv[1:])\nsys.exit(3)\n")
    secrets = (b"SECRETVALUE123", b"TOK456")
    offenders, scripts, done = set(), set(), threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            for proc in Path("/proc").iterdir():
                try:
                    words = (proc / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if any(s in w for w in words for s in secrets):
                    (scripts if words[1:2] == [str(script).encode()] else offenders).add(b" ".join(words)[:300])

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with pytest.raises(StageError) as failed:
            with pt.workflow(site="local", run_dir=tmp_path / "run"):
                pt.script_app(script, args=["--api-key", "SECRETVALUE123", "--token=TOK456"],
                              ranks_per_node=2)().result()
    finally:
        done.set()
        watcher.join()
    assert scripts, "the watcher never saw the script run"
    assert not offenders, offenders
    assert "exited with code 3" in str(failed.value) and not any(s.decode() in str(failed.value) for s in secrets)
    stage = tmp_path / "run" / "leaky"
    for name in (".argv.json", ".env.json", "stdout.txt", "stderr.txt"):
        assert stat.S_IMODE((stage / name).stat().st_mode) == 0o600, name
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file() and path.name not in (".argv.json", "stdout.txt"):  # stdout: what the script printed
            assert not any(s in path.read_bytes() for s in secrets), path


def test_redaction_covers_names_flags_and_urls_but_not_authors():
    from parsl_torch.common.metadata import REDACTED, redact

    got = redact({"author": "Ada", "passphrase": "p1", "pwd": "p2", "access_key": "p3", "hf_token": "p4",
                  "key": "p5", "bearer": "p6", "keys_seen": 3, "db": "postgres://me:p7@host/db",
                  "args": ["--api-key", "p8", "--lr", "3e-4", "--token=p9"], "WANDB_API_KEY": "p10"})
    assert got["author"] == "Ada" and got["keys_seen"] == 3 and got["args"][2:4] == ["--lr", "3e-4"]
    text = repr(got)
    assert not any(f"p{i}'" in text or f"p{i}@" in text for i in range(1, 11)), text
    assert got["db"] == f"postgres://me:{REDACTED}@host/db"
    from parsl_torch.common.metadata import redact_text

    assert redact_text("python m.py --api-key p11 --token=p12 --lr 3e-4 --password 'p 13' --monkey 4") == \
        f"python m.py --api-key {REDACTED} --token={REDACTED} --lr 3e-4 --password {REDACTED} --monkey 4"


def test_a_secret_known_by_its_variable_is_redacted_in_every_form_an_error_carries_it(tmp_path, monkeypatch):
    """An exception text or stderr tail with a secret variable's value (`env=`, the shell's HF_TOKEN), a
    printed argv (`'--hf-token', 'X'`), `db.password=X`, `NAME_TOKEN=X`, `Bearer X`: none reaches the
    rank's report, the stage's error, status.json or the log (all made from these two)."""
    from parsl.app.errors import BashExitFailure

    from parsl_torch.apps.stage.failures import stage_error
    from parsl_torch.common.raised import raised_line

    monkeypatch.setenv("HF_TOKEN", "hf_SHELLSECRET")
    monkeypatch.setenv("PWD", str(tmp_path))  # ("pwd" looks secret; the working directory is not)
    monkeypatch.setenv("SSH_KEY_FILE", str(tmp_path))
    said = raised_line(RuntimeError("request failed: Authorization: Bearer hf_SHELLSECRET"))
    assert "SHELLSECRET" not in said and said.startswith("RuntimeError: request failed: Authorization: Bearer ***")
    # cut short as "invalid key" messages print it; a credential known by its shape; an argument named a secret
    from parsl_torch.common.metadata import argument_secrets

    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-1234567890abcdef")

    def login(cfg, api_key, notes=""):
        pass

    called = argument_secrets(login, ({"wandb": {"token": "WTOKEN445566"}}, "APIKEY778899"), {})
    error = RuntimeError("invalid key sk-live-12... (APIKEY778899, WTOKEN445566, ghp_abcdefghijklmnopqrst); "
                         "wrong password; scikit-learn")
    said = raised_line(error, called)
    assert said == "RuntimeError: invalid key ***... (***, ***, ***); wrong password; scikit-learn", said
    # the call's secrets are its workflow's, not the process's: a later workflow's errors do not carry them
    assert "APIKEY778899" in raised_line(error) and "WTOKEN445566" in raised_line(error)
    stage = tmp_path / "leaky"
    stage.mkdir()
    (stage / ".env.json").write_text(json.dumps({"MY_API_TOKEN": "ENVGIVEN1234", "LR": "0.1"}))
    (stage / "stderr.txt").write_text(
        "argv ['train.py', '--wandb_api_key', 'ARGV5678', '--lr', '0.1']\n"
        "override db.password=PW998877 NAME_TOKEN=NT445566 lr=0.1\n"
        "RuntimeError: cannot log in with ENVGIVEN1234 or hf_SHELLSECRET\n")
    text = str(stage_error("leaky", BashExitFailure("stage_command", 1), stage / "stderr.txt"))
    for secret in ("ARGV5678", "PW998877", "NT445566", "ENVGIVEN1234", "SHELLSECRET"):
        assert secret not in text, text
    assert "'--lr', '0.1'" in text and "lr=0.1" in text  # what is not secret stays
    assert str(stage / "stderr.txt") in text  # paths too


def test_sites_show_hides_secret_environment_values(tmp_path, monkeypatch, capsys):
    (tmp_path / "mine.yaml").write_text("name: mine\nscheduler: local\nenvironment: {WANDB_API_KEY: s3cr3t, A: b}\n")
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(tmp_path))
    assert pt.cli.main(["sites", "show", "mine"]) == 0
    out = capsys.readouterr().out
    assert "s3cr3t" not in out and "WANDB_API_KEY=***" in out and "A=b" in out


def test_a_run_directory_that_is_a_file_is_one_clear_error(tmp_path):
    (tmp_path / "runs").write_text("not a directory")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        with pt.workflow(site="local", run_dir=tmp_path / "runs"):
            pass
    assert (tmp_path / "runs").read_text() == "not a directory"


def test_a_dangling_or_unwritable_run_directory_is_one_clear_error(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="is a link to .*nowhere, which does not exist"):
        with pt.workflow(site="local", run_dir=tmp_path / "link"):
            pass
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="cannot create run directory .*file/runs: Not a directory"):
        with pt.workflow(site="local", run_dir=tmp_path / "file" / "runs"):
            pass


@pytest.mark.slow
def test_workflows_in_one_process_leave_no_open_files(tmp_path):
    """A notebook or a sweep driver runs many workflows: each must close what it opened (Parsl leaves
    its parsl.log open)."""
    def fds() -> set[str]:
        found = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                found.add(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        return found

    for i in range(3):
        with pt.workflow(site="local", run_dir=tmp_path / f"r{i}"):
            pass
        opened = {f for f in fds() if str(tmp_path) in f}
        assert not opened, f"still open after workflow {i}: {opened}"


@pytest.mark.slow
def test_a_symlinked_run_directory_is_used_and_fresh_keeps_the_link(tmp_path):
    (tmp_path / "scratch").mkdir()
    (tmp_path / "runs").symlink_to(tmp_path / "scratch")
    for fresh in (False, True):
        with pt.workflow(site="local", run_dir=tmp_path / "runs", fresh=fresh):
            pass
    assert (tmp_path / "runs").is_symlink() and (tmp_path / "scratch" / "status.json").exists()


def test_the_status_of_a_rerun_that_skipped_keeps_the_result_of_the_run_that_did_the_stage(tmp_path):
    """`parsl-torch status` after a rerun that skipped everything still shows the stage's last step,
    loss and time, said to be the earlier run's (the rerun's own times would say nothing)."""
    import time

    from parsl_torch.apps.session import status
    from parsl_torch.common import stagedir

    first = status.StatusFile(tmp_path, "local")
    first.stage("train", state="waiting", submitted_at=time.time())
    first.stage("train", state="done", seconds=6.2)
    first.finish()
    (tmp_path / "train").mkdir()
    stagedir.write(tmp_path / "train" / f"train{stagedir.PROGRESS_SUFFIX}",
                   stagedir.ProgressRecord(199, 200, "loss", 0.05, time.time()))
    for _ in range(2):  # skipped, then skipped again: still that run's result
        rerun = status.StatusFile(tmp_path, "local")
        rerun.stage("train", state="waiting", submitted_at=time.time())
        rerun.skipped("train")
        rerun.finish()
        _, rows = status.read(tmp_path)
        assert rows[0].state == "skipped"
        assert "step 200/200 loss=0.05" in rows[0].progress and "done by an earlier run" in rows[0].progress
        assert "in 6.2 s" in rows[0].progress


def test_status_shows_a_finished_stage_s_result_what_a_waiting_one_waits_for_and_ranks_trials(tmp_path, capsys):
    """A sweep you can compare: the result (not the last batch's value), `--sort METRIC` best first."""
    import time

    from parsl_torch.apps.session import status
    from parsl_torch.cli import main as cli

    run = status.StatusFile(tmp_path, "local")
    for name, acc, loss in (("lr0.1", 0.5705, 1.2), ("lr0.3", 0.61, 0.9), ("lr1", 0.2, 3.5),
                            ("lr9", float("nan"), float("nan"))):
        run.stage(name, state="waiting", submitted_at=time.time())
        run.stage(name, state="done", seconds=3.0,
                  result=status.result_metrics({"eval_acc": acc, "eval_loss": loss, "model": object(),
                                                "token": "hf_secret"}))
    run.stage("train", state="waiting", submitted_at=time.time())
    run.stage("eval", state="waiting", submitted_at=time.time(), waits_for=["train"])
    run.stage("other", state="waiting", submitted_at=time.time(), waits_for=["lr0.1"])
    _, rows = status.read(tmp_path)
    by = {r.name: r for r in rows}
    assert by["lr0.1"].progress.startswith("result eval_acc=0.5705 eval_loss=1.2")
    assert by["eval"].progress == "for train" and by["other"].progress == "for a free slot"
    assert "[eval] waiting for train\n" in status.plain(*status.read(tmp_path))
    assert cli(["status", str(tmp_path), "--sort", "eval_acc"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["lr0.3", "lr0.1", "lr1", "lr9"] and "eval_acc=0.61" in lines[0]
    assert "hf_secret" not in (tmp_path / "status.json").read_text()  # a result's text is not kept
    assert cli(["status", str(tmp_path), "--sort", "eval_loss"]) == 0  # a loss: lowest first
    assert capsys.readouterr().out.split()[1] == "lr0.3"
    assert cli(["status", str(tmp_path), "--sort", "eval_acc", "--lowest"]) == 0
    assert capsys.readouterr().out.split()[1] == "lr1"
    assert cli(["status", str(tmp_path), "--sort", "acc"]) == 2
    assert "--sort acc: no finished stage's result has it; the results have: eval_acc, eval_loss" in \
        capsys.readouterr().err


def test_results_of_any_size_and_numpy_type_reach_status_and_its_sort(tmp_path, capsys):
    """A metric of 10**400 (status --sort, --lowest and --json ended in OverflowError), of 5,000 digits (the
    workflow could not write status.json at all) and NumPy's float32 (silently missing) are all kept."""
    import numpy as np

    from parsl_torch.apps.session import status
    from parsl_torch.cli import main as cli

    run = status.StatusFile(tmp_path, "local")
    for name, score in (("huge", 10 ** 400), ("digits", 10 ** 5000), ("f32", np.float32(0.5)), ("i64", np.int64(3)),
                        ("neg", -(10 ** 400)), ("flag", np.bool_(True))):
        run.stage(name, state="done", seconds=1.0, result=status.result_metrics({"score": score}))
    run.finish()
    kept = json.loads((tmp_path / "status.json").read_text())["stages"]
    assert {k: v["result"] for k, v in kept.items()} == {
        "huge": {"score": float("inf")}, "digits": {"score": float("inf")}, "f32": {"score": 0.5},
        "i64": {"score": 3}, "neg": {"score": float("-inf")}, "flag": {}}
    for flags in ((), ("--lowest",)):
        assert cli(["status", str(tmp_path), "--sort", "score", *flags]) == 0
        order = [line.split()[1] for line in capsys.readouterr().out.splitlines()]
        assert order == (["neg", "f32", "i64", "huge", "digits"] if flags else ["huge", "digits", "i64", "f32", "neg"])
    assert cli(["status", str(tmp_path), "--json"]) == 0
    assert '"score"' in capsys.readouterr().out


def test_a_run_whose_process_is_gone_or_that_was_stopped_is_not_running(tmp_path):
    """`status` checks the PID it names: a SIGKILLed workflow's run is gone, its stages stopped; a run
    stopped by a signal says which, and when."""
    import time

    from parsl_torch.apps.session import status

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = status.StatusFile(tmp_path, "local")
    run.stage("train", state="waiting", submitted_at=time.time())
    run.data["pid"] = dead.pid  # (as if the workflow were that process, then SIGKILLed)
    run.stage("train", state="waiting")
    data, rows = status.read(tmp_path)
    assert status.ending(data) == f"gone: its process (host {os.uname().nodename}, PID {dead.pid}) no longer runs"
    assert (rows[0].state, rows[0].error) == ("stopped", "the workflow's process is gone")
    run.data["pid"] = os.getpid()  # alive: running
    run.stage("train", state="waiting")
    assert status.ending(status.read(tmp_path)[0]).startswith("running (host ")
    run.finish("terminated (SIGTERM)")
    data, rows = status.read(tmp_path)
    assert status.ending(data).startswith("terminated (SIGTERM) at ")
    assert (rows[0].state, rows[0].error) == ("stopped", "the workflow was terminated (SIGTERM)")


LONG_STAGE = """
import time
import parsl_torch as pt

@pt.distributed_app
def slow(n: int):
    time.sleep(n)
    return {"n": n}

with pt.workflow(site="local", run_dir="runs/x"):
    slow(300)
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, said", [
    (signal.SIGTERM, 143, "terminated (SIGTERM)"),
    # alone: beside three other tests its SIGINT was lost (see the stop-73 note; one cause found since: below)
    pytest.param(signal.SIGINT, 130, "interrupted (SIGINT)", marks=pytest.mark.alone)])
def test_a_workflow_stopped_by_a_signal_says_how_and_leaves_nothing_running(tmp_path, sig, code, said):
    (tmp_path / "long.py").write_text(LONG_STAGE)
    # as from a terminal: a suite started in the background of a script (`cmd &`, as CI runners and nohup jobs
    # are) ignores SIGINT, and so does every process it starts: their Python never raises KeyboardInterrupt
    as_from_a_terminal = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    proc = subprocess.Popen([sys.executable, "-c", as_from_a_terminal, str(BIN / "parsl-torch"), "run", "long.py"],
                            cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = tmp_path / "runs" / "x" / "slow" / ".started"
    deadline = time.monotonic() + 360
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert started.exists(), "the stage never started"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=360)
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    out = subprocess.run([str(BIN / "parsl-torch"), "status", str(tmp_path / "runs" / "x")], capture_output=True,
                         text=True)
    assert f", {said} at " in out.stdout and f"[slow] stopped - the workflow was {said}" in out.stdout, out.stdout
    assert not processes_under(tmp_path), processes_under(tmp_path)


@pytest.mark.slow
def test_a_damaged_output_is_set_aside_and_the_rerun_writes_it_anew(tmp_path):
    """train.h5 overwritten with garbage: the rerun was triggered, then failed reading it, and so did every
    later rerun. Now it is set aside (said in the log: with every file of the finished call, in .previous/)
    and the rerun succeeds; the next run skips."""
    run_dir = tmp_path / "run"
    args = ["--run-dir", str(run_dir), *small_configs(tmp_path)]
    first = run_script(REPO / "workflows" / "train_eval.py", *args)
    assert first.returncode == 0, first.stderr[-3000:]
    history = run_dir / "train" / "train.h5"
    history.write_bytes(b"not an HDF5 file, overwritten by hand")
    again = run_script(REPO / "workflows" / "train_eval.py", *args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[train] runs again: the output train.h5 of its finished run was changed" in again.stderr
    assert "[train] a new computation (the last one finished): the previous one's files go to train/.previous/" \
        in again.stderr, again.stderr[-3000:]
    assert (run_dir / "train" / ".previous" / "train.h5").read_bytes() == b"not an HDF5 file, overwritten by hand"
    with h5py.File(history) as f:
        assert f.attrs["status"] == "complete"
    last = run_script(REPO / "workflows" / "train_eval.py", *args)
    assert last.returncode == 0 and "[train] skipped" in last.stderr, last.stderr[-3000:]


RETRIED = """
import sys
import parsl_torch as pt

@pt.distributed_app(ranks_per_node=1)
def flaky(flag: str) -> int:
    import os
    if os.path.exists(flag):
        os.unlink(flag)
        raise RuntimeError("the first try fails")
    return 42

with pt.workflow(site="local", run_dir=sys.argv[1], retries=1):
    print("RESULT", flaky(sys.argv[2]).result(), flush=True)
"""


@pytest.mark.slow
def test_the_result_of_a_retried_stage_arrives_in_many_small_workflows(tmp_path):
    """Issue 86: in 2 of 10 such workflows the retry's result was written and the workflow waited 120 s, then
    failed with ManagerLost; CI again at stop 93. The cause: the pool connected back through an address of the
    test cluster's bridge, deleted by a cluster test meanwhile (the local site now uses the loopback alone:
    test_sites). Each result must arrive: a hang fails the test before Parsl's 120 s."""
    (tmp_path / "wf.py").write_text(RETRIED)
    for i in range(4):
        flag = tmp_path / f"flag{i}"
        flag.touch()
        out = subprocess.run([sys.executable, "wf.py", f"run{i}", str(flag)], capture_output=True, text=True,
                             timeout=110, cwd=tmp_path, env=clean_env(PYTHONHASHSEED=str(i)))
        assert out.returncode == 0 and "RESULT 42" in out.stdout, out.stderr[-3000:]
        assert not flag.exists()  # (the first try failed: it was retried)
