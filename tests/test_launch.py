"""Scheduler detection, launch commands (golden argv) and real launches."""

from __future__ import annotations

import json
import os
import signal
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from parsl_torch.cli import main as cli
from parsl_torch.errors import ConfigError
from parsl_torch.launch.machines import AURORA_CPU_BIND
from parsl_torch.launch.plan import LaunchRequest, plan_launch
from parsl_torch.launch.schedulers import detect_scheduler
from parsl_torch import sites
from parsl_torch.sites import detect_job

from .conftest import BIN, RANKS_DIR, clean_env

PY = "/venv/bin/python"
SHIM = [PY, "-m", "parsl_torch.launch.shim", "--", PY, "train.py"]  # `python`: the Python that runs parsl-torch
CMD = ("python", "train.py")


def nodefile(tmp_path, *lines, name="nodefile"):
    path = tmp_path / name
    path.write_text("".join(f"{line}\n" for line in lines))
    return str(path)


def plan(env, hostname="x4000c0s0b0n0", n=None, ppn=None, nodes=None, launcher=None):
    d = detect_job(env, hostname)
    return plan_launch(LaunchRequest(CMD, n, ppn, nodes, launcher), d, env, python=PY)


# -- detection -------------------------------------------------------------
@pytest.mark.parametrize("env, hostname, expected", [
    ({}, "laptop", ("local", None, True)),
    ({"PBS_JOBID": "1.aurora"}, "x4102c5s2b0n0", ("pbs", "aurora", True)),
    ({}, "aurora-uan-0010", ("pbs", "aurora", False)),  # a login node: no job yet
    ({}, "polaris-login-02", ("pbs", "polaris", False)),
    ({"PBS_JOBID": "9.polaris"}, "x3004c0s7b0n0", ("pbs", "polaris", True)),
    ({"SLURM_JOB_ID": "7"}, "frontier00123", ("slurm", "frontier", True)),
    ({"LMOD_SYSTEM_NAME": "frontier"}, "login03", ("slurm", "frontier", False)),
    # a machine without a site file is named by PARSL_TORCH_MACHINE (hostnames live in site files only)
    ({"SLURM_JOB_ID": "7", "PARSL_TORCH_MACHINE": "perlmutter"}, "nid001234", ("slurm", "perlmutter", True)),
    ({"SLURM_JOB_ID": "7"}, "vm", ("slurm", None, True)),
    ({"PARSL_TORCH_SCHEDULER": "local", "PBS_JOBID": "1"}, "x4102c5s2b0n0", ("local", "aurora", True)),
])
def test_detection(env, hostname, expected):
    d = detect_job(env, hostname)
    assert (d.scheduler, d.machine, d.in_job) == expected


def test_installed_binaries_are_no_evidence(fake_bin):
    # srun and mpiexec on PATH, but no job variables: still local
    assert detect_job({"PATH": os.environ["PATH"]}, "laptop").scheduler == "local"


def test_bad_overrides():
    with pytest.raises(ConfigError, match="PARSL_TORCH_SCHEDULER='lsf' is unknown"):
        detect_scheduler({"PARSL_TORCH_SCHEDULER": "lsf"})
    with pytest.raises(ConfigError, match="PARSL_TORCH_MACHINE: machine 'summit' is unknown"):
        detect_scheduler({"PARSL_TORCH_MACHINE": "summit"})


# -- golden launch commands ---------------------------------------------------
def test_aurora_two_nodes(tmp_path, fake_bin):
    nf = nodefile(tmp_path, "x4000c0s0b0n0.hostmgmt", "x4000c0s1b0n0.hostmgmt")
    p = plan({"PBS_JOBID": "1.aurora", "PBS_NODEFILE": nf, "PATH": os.environ["PATH"]})
    assert list(p.argv) == [str(fake_bin / "mpiexec"), "--envall", "--np", "24", "--ppn", "12",
                            "--hostfile", nf, "--line-buffer", "--pmi=pmix", "--cpu-bind", AURORA_CPU_BIND, *SHIM]
    assert (p.num_nodes, p.ranks_per_node, p.num_ranks, p.launcher) == (2, 12, 24, "mpiexec")
    assert p.env["MASTER_ADDR"] == "x4000c0s0b0n0.hostmgmt"
    assert 0 < int(p.env["MASTER_PORT"]) < 65536


def test_aurora_duplicated_nodefile_and_fewer_ranks(tmp_path, fake_bin, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # (its host file goes when this process ends)
    nf = nodefile(tmp_path, "a", "a", "b", "b")  # one line per rank slot: deduplicated
    p = plan({"PBS_JOBID": "1", "PBS_NODEFILE": nf, "PATH": os.environ["PATH"]}, nodes=1, ppn=6)
    hostfile = p.argv[p.argv.index("--hostfile") + 1]
    assert hostfile != nf and Path(hostfile).read_text().split() == ["a"]
    assert list(p.argv[1:6]) == ["--envall", "--np", "6", "--ppn", "6"]
    # ALCF's 6-rank list: per socket, never --depth (which straddles sockets)
    assert list(p.argv[8:12]) == ["--line-buffer", "--pmi=pmix", "--cpu-bind",
                                  "list:1-16:17-32:33-48:53-68:69-84:85-100"]


def test_a_launch_s_own_host_file_goes_with_the_process_and_a_dry_run_keeps_it(tmp_path, fake_bin):
    """One host file per stage on part of a block's nodes: none may pile up in the node's /tmp."""
    nf = nodefile(tmp_path, "a", "b")
    env = {**os.environ, "PBS_JOBID": "1", "PBS_NODEFILE": nf, "PARSL_TORCH_MACHINE": "aurora", "TMPDIR": str(tmp_path)}
    planned = subprocess.run([sys.executable, "-c", "from parsl_torch.launch.plan import LaunchRequest, plan_launch; "
                              "from parsl_torch.launch.schedulers import detect_scheduler; "
                              "p = plan_launch(LaunchRequest(('x',), None, 2, 1, None), detect_scheduler()); "
                              "print(p.argv[p.argv.index('--hostfile') + 1])"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.strip().startswith(str(tmp_path)) and not Path(planned.stdout.strip()).exists()
    shown = subprocess.run([str(BIN / "parsl-torch"), "launch", "--nodes", "1", "--ppn", "2", "--dry-run", "--", "x"],
                           env=env, capture_output=True, text=True, timeout=60)
    kept = re.search(r"--hostfile (\S+)", shown.stdout)
    assert kept and Path(kept.group(1)).read_text().split() == ["a"], shown.stdout + shown.stderr


def test_polaris_depth_binding(tmp_path, fake_bin):
    nf = nodefile(tmp_path, "x3004c0s7b0n0", "x3004c0s7b1n0")
    p = plan({"PBS_JOBID": "9", "PBS_NODEFILE": nf, "PATH": os.environ["PATH"]}, hostname="x3004c0s7b0n0")
    assert list(p.argv) == [str(fake_bin / "mpiexec"), "--envall", "--np", "8", "--ppn", "4", "--hostfile",
                            nf, "--line-buffer", "--depth", "8", "--cpu-bind", "depth", *SHIM]
    assert p.env["PARSL_TORCH_GPU_ORDER"] == "3,2,1,0"  # ALCF: local rank r uses GPU 3-r


def test_frontier_srun(fake_bin):
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "frontier[00010-00011]", "PATH": os.environ["PATH"]}
    p = plan(env, hostname="frontier00010")
    assert list(p.argv) == ["srun", "--nodes", "2", "--ntasks", "16", "--ntasks-per-node", "8",
                            "--kill-on-bad-exit=1", "--cpus-per-task", "7", "--gpus-per-task", "1",
                            "--gpu-bind", "closest", *SHIM]
    assert "MASTER_ADDR" not in p.env  # the shim takes the step's first node
    assert plan(env, hostname="frontier00010", n=12).ranks_per_node == 6


def test_local_mpiexec_and_torchrun():
    env = {"PATH": os.environ["PATH"]}
    p = plan(env, hostname="laptop", n=2)
    assert list(p.argv) == [str(BIN / "mpiexec"), "-n", "2", *SHIM]
    assert p.env["MASTER_ADDR"] == "127.0.0.1"
    p = plan(env, hostname="laptop", n=4, launcher="torchrun")
    assert list(p.argv) == [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=4", "--no-python", *SHIM]


def test_user_rendezvous_is_kept():
    p = plan({"MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "1234"}, hostname="laptop", n=2)
    assert p.env == {}


@pytest.mark.parametrize("env, request_, needle", [
    ({"PBS_JOBID": "1"}, {}, "PBS_NODEFILE is not set"),
    ({"PBS_JOBID": "1", "PBS_NODEFILE": "EMPTY"}, {}, "is empty: the job has no nodes"),
    ({"PBS_JOBID": "1", "PBS_NODEFILE": "/nonexistent"}, {}, "cannot be read"),
    ({"PBS_JOBID": "1", "PBS_NODEFILE": "TWO"}, {"n": 30, "ppn": 12}, "-n 30 does not fit 3 node"),
    ({"PBS_JOBID": "1", "PBS_NODEFILE": "TWO"}, {"nodes": 3}, "--nodes 3: the job has only 2 node"),
    ({"PBS_JOBID": "1", "PBS_NODEFILE": "TWO"}, {"n": 4, "ppn": 4, "nodes": 2}, "leaves nodes of the 2 empty"),
    ({"PBS_JOBID": "1", "PBS_NODEFILE": "TWO"}, {"n": 0}, "-n 0: must be at least 1"),
    ({"PBS_JOBID": "1", "PBS_NODEFILE": "TWO", "PARSL_TORCH_MPIEXEC": "/nonexistent/mpiexec"}, {},
     "launcher '/nonexistent/mpiexec' does not exist"),
    ({}, {"launcher": "srun"}, "--launcher srun: under local use mpiexec or torchrun"),
])
def test_bad_launch_requests(tmp_path, fake_bin, env, request_, needle):
    files = {"EMPTY": nodefile(tmp_path, name="empty"), "TWO": nodefile(tmp_path, "a", "b", name="two")}
    env = {k: files.get(v, v) for k, v in env.items()}
    env["PATH"] = os.environ["PATH"]
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        plan(env, hostname="laptop", **request_)


def test_cli_errors_exit_2_and_start_nothing(capsys, monkeypatch):
    monkeypatch.setenv("PARSL_TORCH_SCHEDULER", "pbs")
    monkeypatch.setenv("PBS_JOBID", "1")
    monkeypatch.delenv("PBS_NODEFILE", raising=False)
    assert cli(["launch", "--", "python", "x.py"]) == 2
    assert capsys.readouterr().err.startswith("parsl-torch: error: PBS_NODEFILE is not set")
    monkeypatch.setenv("PARSL_TORCH_SCHEDULER", "local")
    assert cli(["launch", "-n", "2"]) == 2
    assert "no command to launch" in capsys.readouterr().err


def test_python_in_a_launch_command_is_the_python_that_runs_parsl_torch_not_paths():
    """Without an activated venv, PATH's `python` may be another interpreter, without torch: the ranks
    run this one (as `-m MODULE` does); other programs, and a Python given by its path, are as given."""
    d = detect_job({}, "laptop")
    for command, runs in ((("python3", "-c", "x"), (PY, "-c", "x")), (("bash", "-c", "python x"), None),
                          (("/opt/py/bin/python", "x.py"), None)):
        argv = plan_launch(LaunchRequest(command, 1, None, None, None), d, {}, python=PY).argv
        assert tuple(argv[argv.index("--") + 1:]) == (runs or command)


def test_run_without_a_script_says_what_to_give_and_its_flags_are_options_before_or_after_it(tmp_path, capsys,
                                                                                             monkeypatch):
    for name in ("argv", "path"):  # (run changes them for the script, as `python SCRIPT` has them)
        monkeypatch.setattr(sys, name, list(getattr(sys, name)))
    monkeypatch.setenv("PATH", os.environ["PATH"])
    assert cli(["run"]) == 2
    assert "give the workflow script, e.g. parsl-torch run workflows/train_eval.py" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["run", "--help"])
    shown = capsys.readouterr().out
    assert all(flag in shown for flag in ("--site", "--run-dir", "--fresh", "SCRIPT --help shows the script's own"))
    script = tmp_path / "wf.py"
    script.write_text("import sys\nfrom parsl_torch.apps.session.request import _cli_flags\n"
                      "f = _cli_flags.get()\nprint(f.site, f.run_dir, f.fresh, sys.argv[1:])\n")
    assert cli(["run", "--site", "a", "--fresh", str(script), "--run-dir", "r", "--lr", "3"]) == 0
    assert capsys.readouterr().out.strip() == "a r True ['--lr', '3']"


def test_dry_run_prints_the_command(capsys, monkeypatch):
    monkeypatch.setenv("PARSL_TORCH_SCHEDULER", "local")
    assert cli(["launch", "-n", "2", "--dry-run", "-m", "mypkg.train", "--", "--lr", "3e-4"]) == 0
    out = capsys.readouterr().out
    assert f"mpiexec -n 2 {sys.executable} -m parsl_torch.launch.shim -- {sys.executable} -m mypkg.train --lr 3e-4" in out


# -- real launches ------------------------------------------------------------
def parsl_torch(*args, timeout=120, env=None):
    return subprocess.run([str(BIN / "parsl-torch"), *args], capture_output=True, text=True,
                          timeout=timeout, env=env or clean_env())


def ranks_reported(stdout: str) -> list[str]:
    # two ranks share one pipe: their lines may interleave
    return sorted(re.findall(r"rank \d of \d local \d sum \d", stdout))


def leftovers(marker: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(cmdline)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_unmodified_torchrun_script_runs(launcher):
    out = parsl_torch("launch", "-n", "2", "--launcher", launcher, "--",
                      sys.executable, str(RANKS_DIR / "torchrun_style.py"))
    assert out.returncode == 0, out.stderr
    assert ranks_reported(out.stdout) == ["rank 0 of 2 local 0 sum 1", "rank 1 of 2 local 1 sum 1"]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_failing_rank_stops_the_launch_with_its_code(tmp_path, launcher):
    marker = f"exit3-{launcher}-{os.getpid()}"
    t0 = time.monotonic()
    out = parsl_torch("launch", "-n", "2", "--launcher", launcher, "--",
                      sys.executable, str(RANKS_DIR / "misbehave.py"), "exit3", marker)
    assert out.returncode == 3, out.stderr
    assert time.monotonic() - t0 < 30  # the other rank would sleep 600 s
    assert "rank 1 on" in out.stderr and "exited with code 3" in out.stderr
    time.sleep(0.5)
    assert leftovers(marker) == []


@pytest.mark.slow
def test_one_rank_that_fails_is_named_without_talk_of_other_ranks():
    """`parsl-torch launch -n 1 -- python ...` (`python`: this venv's) whose rank fails: one line naming it,
    no "stopping the other 0 rank(s)", no note about the launcher's word on ranks it stopped."""
    env = clean_env()  # as without an activated venv: PATH's `python` (if any) is another one
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p).resolve() != BIN.resolve())
    out = parsl_torch("launch", "-n", "1", "--", "python", "-c", "import torch, sys; sys.exit(3)", env=env)
    assert out.returncode == 3, out.stderr
    assert "rank 0 on" in out.stderr and "exited with code 3" in out.stderr
    assert "No module named" not in out.stderr and "the other" not in out.stderr and "the cause" not in out.stderr
    # a script that calls setup_torch and raises: its line names the exception
    out = parsl_torch("launch", "-n", "1", "--", "python", "-c",
                      "import parsl_torch as pt\npt.setup_torch()\nraise ValueError('lr must be > 0')", env=env)
    assert out.returncode == 1 and re.search(r"rank 0 on \S+ raised ValueError: lr must be > 0\n", out.stderr), \
        out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["killpg", "killparent"])
def test_ranks_that_kill_their_own_processes_fail_the_launch_without_losing_their_node(mode):
    """A rank that kills its process group or its parent ends its node's processes without a report, as
    a lost node's end; this node answers (it runs the supervisor): an application failure, no quarantine."""
    marker = f"{mode}-{os.getpid()}"
    out = parsl_torch("launch", "-n", "2", "--", sys.executable, str(RANKS_DIR / "misbehave.py"), mode, marker)
    assert out.returncode == 137, out.stderr  # (a lost node's launch exits 75)
    assert "was not lost (it runs this launch's supervisor): they were killed" in out.stderr, out.stderr
    time.sleep(0.5)
    assert leftovers(marker) == []


@pytest.mark.slow
def test_timeout_stops_hanging_ranks():
    marker = f"hang-{os.getpid()}"
    t0 = time.monotonic()
    out = parsl_torch("launch", "-n", "2", "--timeout", "5", "--",
                      sys.executable, str(RANKS_DIR / "misbehave.py"), "hang", marker)
    assert out.returncode == 124 and "timed out after 5 s" in out.stderr
    assert time.monotonic() - t0 < 30
    time.sleep(0.5)
    assert leftovers(marker) == []


@pytest.mark.slow
def test_sigterm_tears_everything_down():
    marker = f"sigterm-{os.getpid()}"
    proc = subprocess.Popen([str(BIN / "parsl-torch"), "launch", "-n", "2", "--",
                             sys.executable, str(RANKS_DIR / "misbehave.py"), "hang", marker],
                            env=clean_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(leftovers(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.terminate()
    assert proc.wait(timeout=30) == 128 + 15
    time.sleep(0.5)
    assert leftovers(marker) == []


@pytest.mark.slow
def test_srun_launch_in_a_slurm_job(slurm):
    out = subprocess.run(["salloc", "-n", "2", "--time=5", str(BIN / "parsl-torch"), "launch", "-n", "2", "--",
                          sys.executable, str(RANKS_DIR / "torchrun_style.py")],
                         capture_output=True, text=True, timeout=180, env=clean_env())
    assert out.returncode == 0, out.stderr
    assert "via srun" in out.stderr
    assert ranks_reported(out.stdout) == ["rank 0 of 2 local 0 sum 1", "rank 1 of 2 local 1 sum 1"]
    failing = subprocess.run(["salloc", "-n", "2", "--time=5", str(BIN / "parsl-torch"), "launch", "-n", "2",
                              "--", sys.executable, str(RANKS_DIR / "misbehave.py"), "exit3", "srun-x"],
                             capture_output=True, text=True, timeout=180, env=clean_env())
    assert failing.returncode == 3, failing.stderr


@pytest.mark.slow
def test_doctor_passes_here_and_names_a_broken_setting():
    ok = parsl_torch("doctor", "--json", timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    results = {r["name"]: r for r in json.loads(ok.stdout)}
    assert results["2-rank all_reduce"]["status"] == "ok"
    assert results["torch"]["status"] == "ok"
    bad = parsl_torch("doctor", "--no-smoke", env=clean_env(TORCH_BACKEND="bogus"))
    assert bad.returncode == 1
    assert "[ERROR] device/backend" in bad.stdout and "TORCH_BACKEND='bogus'" in bad.stdout
    assert "-> fix or unset TORCH_DEVICE / TORCH_BACKEND" in bad.stdout
    # the live test fails in the ranks: the doctor shows why, not the teardown's warnings
    broken = parsl_torch("doctor", env=clean_env(MASTER_PORT="not-a-port"), timeout=300)
    assert broken.returncode == 1
    line = next(x for x in broken.stdout.splitlines() if "[ERROR] 2-rank all_reduce" in x)
    assert "MASTER_PORT" in line and "not-a-port" in line, broken.stdout


def test_local_falls_back_to_torchrun_without_mpiexec(monkeypatch):
    from parsl_torch.launch import schedulers

    monkeypatch.setattr(schedulers, "find_local_tool", lambda name: "/usr/bin/true" if name == "torchrun" else None)
    env = {"PARSL_TORCH_SCHEDULER": "local"}
    assert plan(env, hostname="laptop", n=2).launcher == "torchrun"
    with pytest.raises(ConfigError, match="--launcher mpiexec: no mpiexec"):
        plan(env, hostname="laptop", n=2, launcher="mpiexec")


# -- lost nodes (the supervisor's heartbeat listener) -------------------------
def _hello(listener, host="n2", ranks=(2, 3)):
    import socket

    host_port, token = listener.address.rsplit(":", 1)
    sock = socket.create_connection(("127.0.0.1", int(host_port.rsplit(":", 1)[1])))
    sock.sendall((json.dumps({"token": token, "hello": True, "host": host, "ranks": list(ranks)}) + "\n").encode())
    return sock, token


def test_a_silent_node_is_lost_and_a_closed_one_vanished_but_a_finished_one_is_neither():
    import queue

    from parsl_torch.launch.listener import RankListener

    events = queue.Queue()
    listener = RankListener(events, node_timeout=0.6)
    try:
        silent, _ = _hello(listener, "n2", (2, 3))
        node = events.get(timeout=10)
        assert node.kind == "lost" and node.host == "n2"
        assert node.describe().startswith("node n2 lost (ranks 2, 3): no heartbeat for 0.6 s")
        gone, _ = _hello(listener, "n3", (4, 7))
        gone.close()  # EOF without bye: its processes ended without a word
        node = events.get(timeout=10)
        assert (node.kind, node.host) == ("vanished", "n3")
        assert "node n3 lost (ranks 4-7)" in node.describe()
        done, token = _hello(listener, "n4", (8, 8))
        done.sendall((json.dumps({"token": token, "bye": True}) + "\n").encode())
        done.close()
        with pytest.raises(queue.Empty):
            events.get(timeout=1.5)
        silent.close()
    finally:
        listener.close()


def test_when_a_node_never_said_hello_it_is_named_not_the_node_whose_ranks_the_launcher_ended():
    """A node whose link is down at launch never greets; the launcher (its daemon there lost) ends the
    ranks elsewhere, which vanish: the silent node is the lost one (the quarantine must not take n1)."""
    from parsl_torch.launch.events import NodeSilent
    from parsl_torch.launch.nodeloss import blame

    vanished = NodeSilent("vanished", "n1.cluster", (0, 1))
    node = blame(vanished, ("n1.cluster", "n2.cluster"), {"n1"})
    assert (node.kind, node.host) == ("silent", "n2")
    assert node.describe().startswith("node n2 lost: its ranks never reached the launch, and the "
                                      "launcher ended the ranks on n1.cluster")
    assert blame(vanished, ("n1", "n2"), {"n1", "n2"}) == vanished  # all greeted
    assert blame(vanished, ("10.0.0.1", "10.0.0.2"), set()) == vanished  # other names
    lost = NodeSilent("lost", "n1.cluster", (0, 1), 30.0)
    assert blame(lost, ("n1", "n2"), {"n1"}) == lost  # silence names itself


def test_a_bad_node_timeout_names_the_variable():
    from parsl_torch.common.settings import NODE_TIMEOUT

    assert NODE_TIMEOUT.get({}) == 10  # (the default: measured, bench_node_timeout.py)
    assert NODE_TIMEOUT.get({"PARSL_TORCH_NODE_TIMEOUT": "7.5"}) == 7.5
    for bad in ("0", "soon", "-3"):
        with pytest.raises(ConfigError, match="PARSL_TORCH_NODE_TIMEOUT"):
            NODE_TIMEOUT.get({"PARSL_TORCH_NODE_TIMEOUT": bad})


def test_a_stage_error_names_the_lost_node_not_the_ranks_that_failed_after_it(tmp_path):
    from parsl.app.errors import BashExitFailure

    from parsl_torch.apps.stage.failures import stage_error
    from parsl_torch.common.outcome import write_outcome
    from parsl_torch.common.stagedir import OUTCOME as OUTCOME_FILE
    from parsl_torch.launch.events import NodeSilent

    # what the ranks and the launcher printed does not decide the error (any wording): the record does
    stderr = tmp_path / "stderr.txt"
    stderr.write_text("rank 0 on n1: whatever a launcher prints\nBAD TERMINATION OF ONE OF YOUR PROCESSES\n")
    write_outcome(tmp_path, NodeSilent("lost", "n2", (2, 3), 30.0).outcome())
    err = stage_error("train", BashExitFailure("train", 75), stderr)
    assert str(err).startswith("stage 'train' failed: node n2 lost (ranks 2, 3): no heartbeat for 30 s "
                               "(node down or its network cut) (exit code 75)")
    assert "BAD TERMINATION" in str(err)  # the tail is still shown, for people
    # a site without survive_node_loss: Slurm ends the job for the lost node while its supervisor checks the
    # node, and Parsl's worker goes with it; the record written before the check still names the node
    from parsl.executors.high_throughput.errors import ManagerLost

    err = stage_error("train", ManagerLost(b"abc", "n1"), stderr)
    assert str(err).startswith("stage 'train' failed: node n2 lost (ranks 2, 3): no heartbeat for 30 s "
                               "(node down or its network cut) (then ManagerLost: "), str(err)
    (tmp_path / OUTCOME_FILE).unlink()  # no record (the supervisor never ran): no guess from the text
    assert str(stage_error("train", BashExitFailure("train", 1), stderr)).startswith(
        "stage 'train' failed: a rank failed (exit code 1)")
    assert str(stage_error("train", ManagerLost(b"abc", "n1"), stderr)).startswith("stage 'train' failed: ManagerLost")


def test_ranks_per_node_default_to_what_the_job_asked_for(tmp_path, fake_bin):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("a\na\nb\nb\n")  # select=2:mpiprocs=2
    p = plan({"PBS_JOBID": "1", "PBS_NODEFILE": str(nodefile), "PATH": os.environ["PATH"]}, hostname="laptop")
    assert (p.num_nodes, p.ranks_per_node, p.num_ranks) == (2, 2, 4)
    p = plan({"SLURM_JOB_ID": "3", "SLURM_JOB_NODELIST": "c[1-2]", "SLURM_NTASKS_PER_NODE": "3",
              "PATH": os.environ["PATH"]}, hostname="laptop")
    assert (p.num_nodes, p.ranks_per_node, p.num_ranks) == (2, 3, 6)


def test_hydra_gets_no_pals_only_flag(tmp_path):
    from parsl_torch.launch.schedulers import is_hydra

    nodefile = tmp_path / "nodes"
    nodefile.write_text("a\nb\n")
    assert is_hydra(str(BIN / "mpiexec"))  # the venv's MPICH
    p = plan({"PBS_JOBID": "1", "PBS_NODEFILE": str(nodefile), "PARSL_TORCH_MPIEXEC": str(BIN / "mpiexec"),
              "PATH": os.environ["PATH"]}, hostname="laptop")
    assert "--line-buffer" not in p.argv and "--hostfile" in p.argv


@pytest.mark.parametrize("argv, message", [
    (["launch", "--timeout", "-1", "--", "true"], "--timeout -1: give the seconds"),
    (["launch", "--timeout", "nan", "--", "true"], "--timeout nan: give the seconds"),
    (["launch", "-n", "100000", "--", "true"], "more than 1024 is no machine's"),
])
def test_launch_refuses_absurd_numbers_before_starting_anything(argv, message, monkeypatch, capsys):
    monkeypatch.setenv("PARSL_TORCH_SCHEDULER", "local")
    assert cli(argv) == 2
    assert message in capsys.readouterr().err


def test_a_slow_client_does_not_hold_up_a_failure_report():
    import queue
    import socket

    from parsl_torch.launch.listener import RankListener

    events = queue.Queue()
    listener = RankListener(events, node_timeout=60)
    host_port, token = listener.address.rsplit(":", 1)
    port = int(host_port.rsplit(":", 1)[1])
    try:
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"{")  # a client that never finishes its line
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall((json.dumps({"token": token, "rank": 1, "host": "h", "code": 3}) + "\n").encode())
        report = events.get(timeout=5)
        assert str(report) == "rank 1 on h exited with code 3" and time.monotonic() - t0 < 2
        with socket.create_connection(("127.0.0.1", port)) as s:  # a report without the token is ignored
            s.sendall((json.dumps({"token": "guess", "rank": 2, "host": "h", "code": 3}) + "\n").encode())
        with pytest.raises(queue.Empty):
            events.get(timeout=1)
        slow.close()
    finally:
        listener.close()


STRANGER = """
import json, socket, sys, time
port, token_guess = int(sys.argv[1]), sys.argv[2]

def closed(payload, idle=False):
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(5)
    t0 = time.monotonic()
    try:
        if not idle:
            s.sendall(payload)
        return s.recv(1) == b"" and round(time.monotonic() - t0, 1)
    except (BrokenPipeError, ConnectionResetError):
        return round(time.monotonic() - t0, 1)
    except socket.timeout:
        return False
    finally:
        s.close()

print(json.dumps({"big": closed(b"x" * (8 << 20)), "newlines": closed(b"\\n" * (1 << 20)),
                  "guess": closed((json.dumps({"token": token_guess, "reads": [], "rank": 0}) + "\\n").encode()),
                  "idle": closed(b"", idle=True)}))
"""


#: a Python that the user nobody may run (the venv's lives under root's home)
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif((os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK)) and not os.environ.get("CI"),
                    reason="runs the stranger as the user nobody with the system's Python (root only; CI must)")
def test_a_stranger_on_the_node_is_cut_off_at_once_and_changes_nothing(monkeypatch):
    """Another user's process that reaches the supervisor's port: 8 MiB without a newline, 1 MiB of bare
    newlines, a message with a guessed token, a connection that says nothing. Each is closed (at once; the
    silent one after AUTH_S), nothing it sent is kept, and the ranks' own messages still count."""
    import queue

    from parsl_torch.launch import listener as listener_module

    monkeypatch.setattr(listener_module, "AUTH_S", 1.0)
    listener = listener_module.RankListener(queue.Queue(), node_timeout=60)
    port, token = int(listener.address.split(":")[1]), listener.address.rsplit(":", 1)[1]
    try:
        out = subprocess.run([SYSTEM_PYTHON, "-c", STRANGER, str(port), "0" * len(token)], capture_output=True,
                             text=True, timeout=60, user=65534, cwd="/")
        assert out.returncode == 0, out.stderr
        closed = json.loads(out.stdout)
        assert all(closed[k] is not False and closed[k] < 1 for k in ("big", "newlines", "guess")), closed
        assert closed["idle"] is not False and 0.9 <= closed["idle"] < 3, closed
        assert listener.reads == set() and listener.read_ranks == set() and not listener._strangers
        from parsl_torch.launch.shim import send_reads

        assert send_reads(listener.address, 0, {"f /data/x"})
        assert listener.reads == {"f /data/x"} and listener.read_ranks == {0}
    finally:
        listener.close()


def test_the_report_listener_listens_only_where_the_ranks_are():
    import queue
    import socket

    from parsl_torch.launch.listener import RankListener, listen_address

    here = socket.gethostname()
    assert listen_address(("localhost",)) == listen_address((here, here)) == ("127.0.0.1", "127.0.0.1")
    name, bind = listen_address((here, "some-other-node"))
    assert name == here and bind in ("", socket.gethostbyname(here))
    listener = RankListener(queue.Queue(), node_timeout=60, nodes=("localhost",))
    try:
        assert listener.server.getsockname()[0] == "127.0.0.1"  # not reachable from other hosts
        assert listener.address.startswith("127.0.0.1:")
    finally:
        listener.close()


def test_a_launcher_that_waits_for_a_lost_nodes_daemon_is_killed_once_the_other_nodes_ranks_are_gone():
    """After a lost node the launch is stopped with SIGTERM; a launcher that ignores it (mpiexec waits for its
    daemon on the lost node) is killed as soon as ``done()`` says the other nodes' ranks ended, not after its
    grace (60 s here: the call returns long before); without ``done`` it gets the whole grace."""
    from parsl_torch.common.procs import stop

    stubborn = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('up', flush=True); time.sleep(120)"]
    for done, grace in ((lambda: True, 60.0), (None, 1.0)):
        proc = subprocess.Popen(stubborn, stdout=subprocess.PIPE, start_new_session=True)
        assert proc.stdout.readline() == b"up\n"
        t0 = time.monotonic()
        stop(proc, grace, done=done)
        took = time.monotonic() - t0
        assert proc.poll() == -signal.SIGKILL and (took < grace / 2 if done else took >= grace), (done, took)


def test_a_lost_node_is_quarantined_in_its_job_only(tmp_path):
    from parsl_torch.launch import quarantine
    from parsl_torch.sites.build import workflow_config

    path = tmp_path / "quarantine.json"
    assert quarantine.lost_nodes(path, "123") == set()  # no file: nothing is quarantined
    quarantine.add(path, "123", "n2", "node n2 lost (ranks 2, 3): no heartbeat for 10 s")
    quarantine.add(path, "123", "n3", "node n3 lost (rank 4): its processes vanished")
    assert quarantine.lost_nodes(path, "123") == {"n2", "n3"} and quarantine.lost_nodes(path, "124") == set()
    assert quarantine.job_of({"SLURM_JOB_ID": "123"}) == "123" and quarantine.job_of({}) is None
    path.write_text("{damaged")
    assert quarantine.read(path) == {}
    # a workflow's blocks run parsl-torch's pool with the workflow's quarantine file
    mpi = workflow_config([sites.load("local").spec], tmp_path / "parsl").executors[0]
    assert mpi.launch_cmd.startswith(f"parsl-torch-pool --spares 0 {tmp_path / 'parsl' / 'quarantine.json'} -- ")
    # and talk to it encrypted (Parsl's MPIExecutor is not by default): a stranger on the ports, or the
    # interchange of a workflow killed with -9, cannot take or answer a stage
    assert mpi.encrypted and "--cert_dir {cert_dir}" in mpi.launch_cmd


def test_the_interchange_and_the_pool_import_parsl_without_what_they_never_use(tmp_path):
    """``launch.leanparsl``: Parsl's optional Globus Compute executor and monitoring database (0.5 s of CPU
    of Parsl's 1 s import) are not imported by the interchange, the pool or its forkserver; a task the pool
    runs later may still import them. The interchange's module and the pool's import without Parsl's
    ``__init__`` (its data flow kernel, every executor), and ``parsl`` is whole when asked for more.
    typeguard's instrumenting of Parsl's functions is left out there too, and is itself again after; so it is
    in a workflow's process (Parsl whole there: its Globus Compute executor works), unless the script imported
    Parsl first."""
    from parsl_torch.sites.build import workflow_config

    mpi = workflow_config([sites.load("local").spec], tmp_path / "parsl").executors[0]
    assert mpi.interchange_launch_cmd == [sys.executable, "-m", "parsl_torch.launch.interchange"]
    code = ("import importlib.util, sys\n"
            "unused = ('globus_compute_sdk', 'sqlalchemy')\n"
            "present = [m for m in unused if importlib.util.find_spec(m)]\n"
            "import parsl_torch.launch.pool_preload\n"  # what the pool's forkserver imports
            "print(sorted(m for m in unused if m in sys.modules))\n"
            "for m in present: __import__(m)\n"
            "print(len(present), 'imported later')")
    out = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    first, later = out.stdout.splitlines()
    assert first == "[]" and later.endswith("imported later"), out.stdout
    code = ("import sys\n"
            "from parsl_torch.launch.leanparsl import import_lean\n"
            "from parsl_torch.launch.interchange import INTERCHANGE_MODULE\n"
            "from parsl_torch.launch.pool import POOL_MODULE\n"
            "import_lean(INTERCHANGE_MODULE, POOL_MODULE)\n"
            "print('parsl.dataflow.dflow' in sys.modules, 'parsl.executors.flux.executor' in sys.modules)\n"
            "import parsl, typeguard\n"
            "from parsl import python_app\n"
            "print(parsl.File.__module__, python_app.__module__, parsl.executors.HighThroughputExecutor.__name__)\n"
            "checks = lambda f: any(n.startswith('check_argument_types') for n in f.__code__.co_names)\n"
            "print(checks(sys.modules['parsl.log_utils'].set_file_logger), checks(python_app))\n"  # (imported after)
            "print(typeguard.typechecked.__module__)")
    out = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False", "parsl.data_provider.files", "parsl.app.app",
                                  "HighThroughputExecutor", "False", "True", "typeguard"], out.stdout
    # a workflow's process: Parsl whole, its functions as written, unless the script imported it first
    code = ("import sys\n"
            "first = sys.argv[1] == 'first'\n"
            "if first: import parsl\n"
            "from parsl_torch.launch.leanparsl import parsl_for_a_workflow\n"
            "parsl_for_a_workflow()\n"
            "import parsl.config, parsl.providers, typeguard\n"
            "checks = lambda f: any(n.startswith('check_argument_types') for n in f.__code__.co_names)\n"
            "print(checks(parsl.config.Config.__init__), checks(parsl.providers.SlurmProvider.__init__),\n"
            "      'globus_compute_sdk' in sys.modules or not __import__('importlib.util').util.find_spec("
            "'globus_compute_sdk'), typeguard.typechecked.__module__)")
    for how, checked in (("first", "True"), ("after", "False")):
        out = subprocess.run([sys.executable, "-c", code, how], env=clean_env(), capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0 and out.stdout.split() == [checked, checked, "True", "typeguard"], out


def test_a_rank_killed_by_sigkill_is_named_though_its_peers_exception_was_heard_first():
    """A rank SIGKILLed makes its peers raise at once (gloo: "Connection closed by peer"), and on a loaded
    machine their report may come first (this session's CI, a remote stage): the kill heard within the
    supervisor's second is the cause named; a kill after a kill, after that second, or by SIGTERM (which a
    launcher may send the others once one failed) is not."""
    import queue
    import threading

    from parsl_torch.launch.events import NodeSilent, RankReport, cause_within

    peer = RankReport(0, "n1", 1, raised="RuntimeError: Connection closed by peer [10.77.0.12]:63203")
    killed, other_kill = RankReport(1, "n2", -9), RankReport(2, "n2", -9)
    events: queue.Queue = queue.Queue()
    threading.Timer(0.2, events.put, [killed]).start()
    assert cause_within(events, 5.0, peer) is killed and str(killed) == "rank 1 on n2 was killed by SIGKILL"
    events.put(other_kill)
    assert cause_within(events, 0.3, killed) is None  # the first kill is the cause: later ones are dropped
    lost = NodeSilent("lost", "n3", (4, 5), 10.0)
    for event in (RankReport(3, "n1", 1, raised="ValueError: bad"), lost):
        events.put(event)
    assert cause_within(events, 5.0, killed) is lost  # a lost node is named whoever failed first
    events.put(RankReport(1, "n2", -15))
    assert cause_within(events, 0.3, peer) is None  # SIGTERM: perhaps the launcher's, after the peer failed
    threading.Timer(0.5, events.put, [killed]).start()
    assert cause_within(events, 0.1, peer) is None  # heard too late: the peer's own exception is named


def test_a_shim_whose_command_ended_tells_hydra_its_rank_is_done():
    """Each shim says PMI's goodbye once its command ended well (``common.pmi``): without it the node's
    hydra proxy spun a core from that rank's end to the last rank's."""
    shim = [sys.executable, "-m", "parsl_torch.launch.shim", "--", sys.executable, "-c", "pass"]
    out = subprocess.run([str(BIN / "mpiexec"), "-verbose", "-n", "2", *shim], env=clean_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.count("cmd=finalize_ack") == 2, out.stdout[-2000:]


def test_a_rank_that_raises_is_named_with_its_exception_by_its_shim_which_leaves_no_file(tmp_path):
    """What a failing function stage's rank leaves (``write_raised``) is in its shim's report: one line,
    a secret flag's value redacted, written here by a process the rank started (as torchrun's workers are);
    the node-local file is gone afterwards, whatever the exit: a shim killed with SIGKILL included."""
    writer = ("import sys; from parsl_torch.common import settings; from parsl_torch.common.raised import write_raised\n"
              "write_raised(ValueError('bad lr --token=hunter2\\n  second line'), settings.RAISED.get()); sys.exit(1)")
    rank = f"import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', {writer!r}]).returncode)"
    env = clean_env(TMPDIR=str(tmp_path), RANK="0", WORLD_SIZE="1")
    env.pop("PARSL_TORCH_LAUNCH_NOTIFY", None)  # no launch to tell: the shim says it itself
    out = subprocess.run([sys.executable, "-m", "parsl_torch.launch.shim", "--", sys.executable, "-c", rank],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert re.search(r"parsl-torch: rank 0 on \S+ raised ValueError: bad lr --token=\*\*\* second line\n", out.stderr)
    assert "hunter2" not in out.stderr
    # a script's exception that reaches the top (``setup_torch`` adds the hook that writes it)
    script = "from parsl_torch.common.raised import report_uncaught\nreport_uncaught()\nraise KeyError('no such field')"
    out = subprocess.run([sys.executable, "-m", "parsl_torch.launch.shim", "--", sys.executable, "-c", script],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" in out.stderr  # (shown as before)
    assert re.search(r"parsl-torch: rank 0 on \S+ raised KeyError: 'no such field'\n", out.stderr), out.stderr
    ok = subprocess.run([sys.executable, "-m", "parsl_torch.launch.shim", "--", sys.executable, "-c", "pass"],
                        env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and not ok.stderr
    killed = subprocess.Popen([sys.executable, "-m", "parsl_torch.launch.shim", "--", sys.executable, "-c",
                               "import time; print('up', flush=True); time.sleep(60)"], env=env, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    assert killed.stdout.readline() == "up\n"
    os.killpg(killed.pid, signal.SIGKILL)  # the shim and its rank, as a launcher ends a failed job's
    killed.wait(timeout=60)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_rank_that_stops_itself_is_named_not_the_peer_that_waited_for_it():
    """Rank 1 stops itself (SIGSTOP): rank 0's collective times out, and the error names rank 1 as stopped."""
    code = ("import os, signal, torch, torch.distributed as dist, parsl_torch as pt; pt.setup_torch(); "
            "dist.get_rank() == 1 and os.kill(os.getpid(), signal.SIGSTOP); dist.all_reduce(torch.ones(1))")
    out = parsl_torch("launch", "-n", "2", "--", sys.executable, "-c", code, env=clean_env(PARSL_TORCH_TIMEOUT="8"))
    assert out.returncode != 0
    assert re.search(r"rank 1 on \S+ was stopped by a signal \(SIGSTOP or SIGTSTP\) at [\d:]+ and stopped answering "
                     r"its peers; then rank 0 on", out.stderr), out.stderr
