"""Ranks follow the accelerators: a stage's and a launch's default ranks per node is the number of
accelerators the node has (CPU-only machines keep the site's CPU count), and two ranks of one node
on one device under nccl are refused by every rank before the process group starts. The device
counts are faked (visibility variables, a fake /dev and KFD tree); the claim runs in real ranks
over a real rendezvous store; the ``gpu`` tests need a GPU (the accelerator machine)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import parsl_torch as pt
from parsl_torch import sites
from parsl_torch.launch.accelerators import visible_accelerators, visible_ids

from .conftest import BIN, RANKS_DIR, clean_env


def test_visible_accelerators_from_the_variables_the_drivers_and_nothing(tmp_path):
    dev, kfd = tmp_path / "dev", tmp_path / "kfd"
    dev.mkdir()
    assert visible_accelerators({}, dev=str(dev), kfd=str(kfd)) == 0  # a laptop
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "renderD128"):
        (dev / name).touch()
    assert visible_accelerators({}, dev=str(dev), kfd=str(kfd)) == 2  # /dev/nvidia<N> only
    assert visible_accelerators({"CUDA_VISIBLE_DEVICES": "3"}, dev=str(dev)) == 1  # the variable decides
    assert visible_accelerators({"CUDA_VISIBLE_DEVICES": ""}, dev=str(dev)) == 0
    assert visible_accelerators({"CUDA_VISIBLE_DEVICES": "-1"}, dev=str(dev)) == 0
    assert visible_accelerators({"ZE_AFFINITY_MASK": "0.0,0.1,1.0"}, dev=str(tmp_path)) == 3
    for node, gpu in (("0", "0"), ("1", "4321"), ("2", "9876")):  # a CPU node and two MI250X GCDs
        (kfd / node).mkdir(parents=True)
        (kfd / node / "gpu_id").write_text(gpu + "\n")
    assert visible_accelerators({}, dev=str(tmp_path / "nodev"), kfd=str(kfd)) == 2
    # their ids, in the numbering of the variable that narrows them (what a stage sharing the node is given)
    assert visible_ids({}, dev=str(dev), kfd=str(kfd)) == (("0", "1"), "CUDA_VISIBLE_DEVICES")
    assert visible_ids({"CUDA_VISIBLE_DEVICES": "2, 3,-1"}, dev=str(dev)) == (("2", "3"), "CUDA_VISIBLE_DEVICES")
    assert visible_ids({}, dev=str(tmp_path / "nodev"), kfd=str(kfd)) == (("0", "1"), "ROCR_VISIBLE_DEVICES")


@pytest.mark.parametrize("visible, expected", [("0", 1), ("0,1,2,3", 4), ("", 2)])
def test_the_local_sites_stages_take_one_rank_per_visible_gpu_and_two_without(visible, expected, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert sites.load("local").ranks_per_node == expected
    assert sites.load("polaris").ranks_per_node == 4  # a facility's nodes: its machine record


def test_parsl_torch_launch_defaults_to_one_rank_per_visible_gpu(monkeypatch):
    from parsl_torch.launch.plan import LaunchRequest, plan_launch
    from parsl_torch.launch.schedulers import detect_scheduler

    env = clean_env(PARSL_TORCH_SCHEDULER="local", CUDA_VISIBLE_DEVICES="0,1,2")
    plan = plan_launch(LaunchRequest(command=("python", "x.py")), detect_scheduler(env), env)
    assert plan.num_ranks == 3
    env["CUDA_VISIBLE_DEVICES"] = ""
    assert plan_launch(LaunchRequest(command=("python", "x.py")), detect_scheduler(env), env).num_ranks == 1


@pytest.mark.slow
def test_a_device_is_claimed_by_its_uuid_and_else_by_its_number_on_the_node(monkeypatch):
    """Two ranks given the same GPU under their own CUDA_VISIBLE_DEVICES both see it as cuda:0: its UUID
    tells; without one (or with a UUID object whose text is a per-process repr), the node's numbering."""
    import torch

    from parsl_torch.core.claim import device_key

    class Props:
        def __init__(self, uuid):
            self.uuid = uuid

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props("GPU-5a1d"))
    assert device_key(torch.device("cuda", 0)) == "cuda:GPU-5a1d"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    for uuid in (None, "", object()):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index, u=uuid: Props(u))
        assert device_key(torch.device("cuda", 1)) == "cuda:3"


@pytest.mark.slow  # (two 2-rank launches: out of make test-fast)
@pytest.mark.lowest
def test_ranks_that_claim_one_device_are_all_refused_and_ranks_with_their_own_pass():
    def run(mode: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "parsl-torch"), "launch", "-n", "2", "--", sys.executable,
                               str(RANKS_DIR / "claim_devices.py"), mode], capture_output=True, text=True,
                              timeout=120, env=clean_env(PARSL_TORCH_SCHEDULER="local"))

    shared = run("same")
    assert shared.returncode == 3, shared.stdout + shared.stderr
    # (the first rank refused ends the launch: the supervisor stops the other, so one line may be all)
    refused = re.findall(r"rank (\d) refused: (.*)", shared.stdout)
    assert refused and all("2 ranks of node" in why and "would share one cuda device (cuda:GPU-same)" in why
                           and "ranks_per_node=1" in why and "TORCH_BACKEND=gloo" in why for _, why in refused)
    own = run("own")
    assert own.returncode == 0, own.stdout + own.stderr
    assert sorted(re.findall(r"rank (\d) claimed", own.stdout)) == ["0", "1"]


@pytest.mark.gpu
def test_two_ranks_on_one_gpu_under_nccl_are_refused_in_seconds_naming_the_fix():
    import torch

    if torch.cuda.device_count() != 1:
        pytest.skip("needs a machine with exactly one GPU")
    out = subprocess.run([str(BIN / "parsl-torch"), "launch", "-n", "2", "--", sys.executable, "-c",
                          "import parsl_torch as pt; pt.setup_torch(); pt.cleanup()"],
                         capture_output=True, text=True, timeout=120, env=clean_env(PARSL_TORCH_SCHEDULER="local"))
    assert out.returncode != 0
    assert "2 ranks of node" in out.stderr and "ranks_per_node=1" in out.stderr, out.stderr[-3000:]


@pytest.mark.gpu
def test_the_local_site_runs_one_rank_per_gpu():
    import torch

    assert sites.load("local").ranks_per_node == torch.cuda.device_count()


@pt.distributed_app(ranks_per_node=1)
def precision_call(step: int):
    """Call 0 sets the matmul precision with both of torch's APIs, as scripts mix them; call 1, on the same
    warm rank, compiles on the GPU (inductor reads the precision) and reads it."""
    import torch

    pt.setup_torch()
    if step == 0:
        torch.set_float32_matmul_precision("high")
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        return {"pid": os.getppid()}
    model = torch.compile(torch.nn.Linear(64, 64).cuda())
    out = model(torch.randn(8, 64, device="cuda"))
    return {"pid": os.getppid(), "matmul": torch.get_float32_matmul_precision(), "shape": list(out.shape),
            "device": torch.cuda.current_device()}


@pytest.mark.gpu
@pytest.mark.slow
def test_a_warm_call_compiles_on_the_gpu_after_one_that_set_the_matmul_precision(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pt.workflow(site="local", run_dir="runs", warm=True):
        first = precision_call(0, stage="p0").result(timeout=300)
        second = precision_call(1, stage="p1").result(timeout=600)
    assert first["pid"] == second["pid"]  # one warm rank forked both calls (pid: the parent's)
    assert second == {"pid": first["pid"], "matmul": "highest", "shape": [8, 64], "device": 0}
