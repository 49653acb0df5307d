"""Bring your own script: script_app, `parsl-torch run` / `launch`, and History as ezpz users call it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import pytest

import parsl_torch as pt
from parsl_torch.apps.stage.scriptargs import caller_path, script_stage_name
from parsl_torch.cli import main as cli

from .conftest import BIN, clean_env

# a torchrun-style trainer in a folder, as minGPT-ddp's mingpt/main.py: env:// rendezvous, a relative
# --data path, its log written under a relative name in its working directory
MAIN_PY = """
import argparse, os
import torch, torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--data", required=True)
p.add_argument("--epochs", type=int, default=2)
args = p.parse_args()
dist.init_process_group("gloo")
tokens = [float(x) for x in open(args.data).read().split()]
total = torch.tensor([sum(tokens) * (dist.get_rank() + 1)])
dist.all_reduce(total)
if dist.get_rank() == 0:
    with open("log.txt", "w") as f:
        f.write(f"epochs={args.epochs} world={dist.get_world_size()} sum={total.item():g} "
                f"omp={os.environ.get('OMP_NUM_THREADS')}\\n")
dist.destroy_process_group()
"""

WORKFLOW = """
import sys
import parsl_torch as pt

print("argv", sys.argv[1:], flush=True)
trainer = pt.script_app("mingpt/main.py", args=["--data", "data/tokens.txt", "--epochs", "3"])
silent = pt.script_app("mingpt/main.py", args=["--data=data/tokens.txt"], name="silent")
with pt.workflow(site="local", run_dir="runs/default") as wf:
    done = trainer(outputs=["log.txt"])
    print("result", done.result(), done.stage, wf.run_dir, flush=True)
    failed = silent(outputs=["model.pt"])
    try:
        failed.result()
    except pt.StageError as exc:
        print("missing:", exc, flush=True)
    try:  # its file raises the same error as its result
        failed.outputs[0].result()
    except pt.StageError as exc:
        print("output:", exc, flush=True)
"""


def test_script_stage_names_and_caller_paths(tmp_path, monkeypatch):
    assert script_stage_name("mingpt/main.py", False) == "mingpt"
    assert script_stage_name("examples/ddp/multigpu_torchrun.py", False) == "multigpu_torchrun"
    assert script_stage_name("pkg.train", True) == "train" and script_stage_name("pkg.__main__", True) == "pkg"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.npy").write_text("")
    assert caller_path("data/x.npy") == str(tmp_path / "data" / "x.npy")
    assert caller_path("--data=data/x.npy") == f"--data={tmp_path / 'data' / 'x.npy'}"
    assert caller_path(Path("not/yet")) == str(tmp_path / "not" / "yet")  # a Path is always a path
    for arg in ("--lr", "3e-4", "data/missing.npy", 3, "/abs/path"):
        assert caller_path(arg) == arg


@pytest.mark.slow
def test_a_folder_script_runs_from_the_workflow_with_run_flags_and_a_missing_output_is_named(tmp_path):
    (tmp_path / "mingpt").mkdir()
    (tmp_path / "mingpt" / "main.py").write_text(MAIN_PY)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tokens.txt").write_text("1 2 3 4")
    (tmp_path / "wf.py").write_text(WORKFLOW)
    # run's own flags, wherever they stand; the rest (and all after --) are the script's
    out = subprocess.run([str(BIN / "parsl-torch"), "run", "wf.py", "--run-dir", "runs/mine", "--fresh", "-v",
                          "--", "--site", "x"], capture_output=True, text=True, timeout=300, env=clean_env(),
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "argv ['-v', '--site', 'x']" in out.stdout
    run_dir = tmp_path / "runs" / "mine"
    assert f"result 0 mingpt {run_dir}" in out.stdout
    assert "run dir runs/mine from parsl-torch run --run-dir (the script asked for runs/default)" in out.stderr
    log = (run_dir / "mingpt" / "log.txt").read_text()
    assert log == "epochs=3 world=2 sum=30 omp=1\n"  # the relative --data was the caller's
    assert not (tmp_path / "runs" / "default").exists()
    assert (f"missing: stage 'silent' finished but did not write its output(s) {run_dir / 'silent' / 'model.pt'}: "
            f"its ranks run in {run_dir / 'silent'}") in out.stdout
    assert "output: stage 'silent' finished but did not write its output(s)" in out.stdout, out.stdout


TRAIN_CKPT = """
import argparse, os, torch
p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args = p.parse_args()
if int(os.environ["RANK"]) == 0:
    torch.save({"w": torch.ones(3)}, args.out)
"""

EVAL_CKPT = """
import argparse, json, os, torch
p = argparse.ArgumentParser()
p.add_argument("ckpt")
p.add_argument("--scale", type=float, default=1.0)
args = p.parse_args()
if int(os.environ["RANK"]) == 0:
    w = torch.load(args.ckpt)["w"]
    json.dump({"sum": float(w.sum()) * args.scale, "ckpt": args.ckpt}, open("eval.json", "w"))
"""

CHAIN = """
import json, sys
import parsl_torch as pt

train = pt.script_app("train_ckpt.py", args=["--out", "ckpt.pt"])
evaluate = pt.script_app("eval_ckpt.py")
with pt.workflow(site="local", run_dir="runs/chain"):
    t = train(outputs=["ckpt.pt"])
    e = evaluate(t.outputs[0], "--scale", float(sys.argv[1]), outputs=["eval.json"])
    print("RESULT", json.dumps(json.load(open(e.outputs[0].result().filepath))), flush=True)
"""


def test_a_script_call_s_arguments_and_outputs_on_its_command_line(tmp_path, monkeypatch):
    from parsl_torch.apps.stage.scriptargs import check_script_argument, script_word
    from parsl_torch.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt.pt").write_text("the user's own")
    (tmp_path / "data.txt").write_text("1")
    stage = tmp_path / "run" / "train"
    for arg, outputs, word in [("ckpt.pt", ["ckpt.pt"], str(stage / "ckpt.pt")),  # an output: never the caller's
                               ("--out=ckpt.pt", [Path("ckpt.pt")], f"--out={stage / 'ckpt.pt'}"),
                               ("ckpt.pt", [], str(tmp_path / "ckpt.pt")),
                               ("data.txt", ["ckpt.pt"], str(tmp_path / "data.txt")),
                               (Path("sub/new.bin"), ["sub/new.bin"], str(stage / "sub" / "new.bin")),
                               (3, ["ckpt.pt"], 3)]:
        assert script_word(arg, outputs, stage) == word
    for bad in ({"lr": 1}, [1, 2], None, True):
        with pytest.raises(ConfigError, match="cannot go on a script's command line"):
            check_script_argument(bad, "stage 'eval'")


@pytest.mark.slow
def test_a_script_chain_passes_the_checkpoint_and_keeps_the_user_s_own_file(tmp_path):
    """train script -> eval script, the checkpoint handed on as a call argument; a file named as the
    output in the working directory is the user's and stays as it was."""
    for name, text in (("train_ckpt.py", TRAIN_CKPT), ("eval_ckpt.py", EVAL_CKPT), ("wf.py", CHAIN)):
        (tmp_path / name).write_text(text)
    (tmp_path / "ckpt.pt").write_text("the user's own")
    run_dir = tmp_path / "runs" / "chain"

    def chain(scale: str) -> tuple[dict, str]:
        out = subprocess.run([sys.executable, "wf.py", scale], capture_output=True, text=True, timeout=300,
                             env=clean_env(), cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.split("RESULT ", 1)[1]), out.stderr

    result, _ = chain("2")
    assert result == {"sum": 6.0, "ckpt": str(run_dir / "train_ckpt" / "ckpt.pt")}
    assert (tmp_path / "ckpt.pt").read_text() == "the user's own"
    result, log = chain("3")  # another argument: only the evaluation runs again
    assert result["sum"] == 9.0 and "[train_ckpt] skipped" in log and "[eval_ckpt] runs again" in log, log


def test_launch_without_the_separator_says_where_it_goes(capsys):
    with pytest.raises(SystemExit) as code:
        cli(["launch", "-n", "2", "python", "-u", "x.py"])
    assert code.value.code == 2
    assert "put `--` before the command: parsl-torch launch -n 2 -- python -u x.py" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["launch", "--bogus", "--", "true"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def _launch(tmp_path, body: str, *args: str, n: int = 2, env=None, via=("launch",)) -> subprocess.CompletedProcess:
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent(body))
    if via == ("launch",):
        cmd = [str(BIN / "parsl-torch"), "launch", "-n", str(n), "--", sys.executable, str(script), *args]
    else:
        cmd = [str(BIN / "mpiexec"), "-n", str(n), sys.executable, str(script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env or clean_env(), cwd=tmp_path)


@pytest.mark.slow
def test_launch_sets_omp_threads_as_torchrun_and_names_the_launcher_and_the_failed_rank_last(tmp_path):
    env = clean_env()
    env.pop("OMP_NUM_THREADS")
    out = _launch(tmp_path, """
        import os, sys, parsl_torch as pt
        pt.setup_torch()
        sys.stdout.write(f"rank {pt.get_rank()} omp {os.environ.get('OMP_NUM_THREADS')}\\n")  # one write:
        sys.stdout.flush()  # print() may split a line from its newline, and ranks' lines then merge
        pt.cleanup()
        if pt.get_rank() == 1 and sys.argv[1] == "fail":
            sys.exit(3)
        """, "fail", env=env)
    assert out.returncode == 3
    assert "rank 0 omp 1" in out.stdout and "rank 1 omp 1" in out.stdout
    assert "ranks from mpich, via parsl-torch's shim" in out.stderr  # not "torchrun": mpiexec started them
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("parsl-torch: rank 1 on ") and "exited with code 3 (the cause" in last
    out = _launch(tmp_path, "import os, sys; sys.stdout.write(f\"omp {os.environ['OMP_NUM_THREADS']}\\n\")",
                  env={**env, "OMP_NUM_THREADS": "4"})
    assert out.stdout.splitlines() == ["omp 4", "omp 4"]  # a value of the user's stays


FINALIZE_ON_RANK0 = """
    import sys, time, parsl_torch as pt
    rank = pt.setup_torch()
    h = pt.History("t", sync_every=4)
    for step in range(10):
        h.update({"loss": 1.0 / (step + 1) + rank})
    if rank == 0:
        t0 = time.monotonic()
        try:
            print("finalized", h.finalize("out.h5", plot=False, ranks=sys.argv[1]), flush=True)
        except pt.ConfigError as exc:
            print(f"error after {time.monotonic() - t0:.0f} s: {exc}", flush=True)
    pt.cleanup()
    pt.exit_process(0)
    """


@pytest.mark.slow
@pytest.mark.parametrize("via", [("launch",), ("mpiexec",)])
def test_finalize_on_rank_0_alone_fails_within_the_timeout_naming_the_fix(tmp_path, via):
    out = _launch(tmp_path, FINALIZE_ON_RANK0, "all", env=clean_env(PARSL_TORCH_TIMEOUT="8"), via=via)
    assert "not every rank called it" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "every rank must call finalize, or call finalize(path, ranks='this') on rank 0 alone" in out.stdout
    took = float(out.stdout.split("error after ")[1].split(" s")[0])
    assert took <= 10
    assert not (tmp_path / "out.h5").exists()


@pytest.mark.slow
def test_finalize_on_rank_0_alone_when_asked_keeps_every_step(tmp_path):
    out = _launch(tmp_path, FINALIZE_ON_RANK0, "this")
    assert out.returncode == 0 and "finalized" in out.stdout, out.stderr[-2000:]
    with h5py.File(tmp_path / "out.h5") as f:
        assert list(f["step"][:]) == list(range(10)) and f.attrs["status"] == "complete"
        assert f.attrs["rank0_only_from_step"] == 8  # steps 0-7 were synced over both ranks
        assert f["loss_mean"][0] == pytest.approx(1.5) and f["loss_mean"][9] == pytest.approx(0.1)


def test_finalize_refuses_an_unknown_mode(tmp_path):
    h = pt.History("t", path=tmp_path / "h.h5")
    with pytest.raises(pt.ConfigError, match=r"finalize\(ranks='every'\): use 'all'"):
        h.finalize(ranks="every")


OWN = Path(__file__).parent / "own_scripts"


@pytest.mark.slow
@pytest.mark.parametrize("script, expected", [
    ("ezpz_quickstart.py", "DATASET steps=30 vars=['dt', 'dt_max', 'dt_mean'] world=2 device=cpu backend=gloo"),
    ("ezpz_minimal.py", "DATASET steps=27 first=3 rank=0 world=2 ts=17 mem={}"),
])
def test_ezpz_scripts_run_on_two_ranks_through_the_compat_module(tmp_path, script, expected):
    out = subprocess.run([str(BIN / "parsl-torch"), "launch", "-n", "2", "--", sys.executable, str(OWN / script)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=clean_env(TRAIN_ITERS="30", OUTDIR=str(tmp_path / "out")))
    assert out.returncode == 0, out.stderr[-3000:]
    assert expected in out.stdout
    written = list((tmp_path / "out").glob("*.h5"))
    assert len(written) == 1
    with h5py.File(written[0]) as f:
        assert f.attrs["status"] == "complete" and f.attrs["world_size"] == 2


def test_ezpz_names_map_onto_ours_and_what_is_not_covered_says_so(tmp_path, monkeypatch):
    import torch

    import parsl_torch.compat.ezpz as ezpz

    assert ezpz.get_torch_device() == "cpu" and ezpz.get_torch_device(as_torch_device=True) == torch.device("cpu")
    assert ezpz.get_world_size(total=True) == ezpz.get_world_size(in_use=True) == 1
    assert ezpz.distributed.get_rank is ezpz.dist.get_rank is pt.get_rank
    assert len(ezpz.get_timestamp()) == len("2026-11-22-120000")
    model = torch.nn.Linear(2, 2)
    assert ezpz.wrap_model(model) is model  # one process: unchanged, as ours (bf16 FSDP is accepted)
    with pytest.raises(pt.ConfigError, match="dtype='int8'"):
        ezpz.wrap_model(model, dtype="int8")
    with pytest.raises(pt.ConfigError, match=r"compat\.ezpz: setup_torch\(tensor/pipeline/context_parallel_size"):
        ezpz.setup_torch(tensor_parallel_size=2)
    with pytest.raises(pt.ConfigError, match=r"backends='tensorboard'.*not covered"):
        ezpz.History(backends="tensorboard")
    monkeypatch.chdir(tmp_path)
    h = ezpz.History(jsonl_path=tmp_path / "m.jsonl")
    assert h.update({"iter": 3, "loss": 0.5}, precision=2) == "iter=3 loss=0.50"
    ds = h.finalize(outdir=tmp_path / "o", run_name="r")
    assert list(ds["step"].values) == [3] and (tmp_path / "o" / "r.h5").exists()
    assert (tmp_path / "m.jsonl").read_text().strip() == '{"step": 3, "iter": 3.0, "loss": 0.5}'
