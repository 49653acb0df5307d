"""Stages smaller than a node share it, each on its own accelerators (``launch.packing``, placed by
parsl-torch's worker pool): on a site whose nodes declare accelerators, so no GPU is needed."""

from __future__ import annotations

import json
import os

import pytest

import parsl_torch as pt
from parsl_torch.launch.cpushare import CpuShare, bound
from parsl_torch.launch.machines import MACHINES
from parsl_torch.launch.packing import Grant, Slots

ACCELERATORS = ("0", "1", "2", "3")


def test_small_stages_share_a_node_on_their_own_accelerators_and_whole_ones_wait_for_a_whole_node():
    slots = Slots(["n1", "n1", "n2"], ACCELERATORS)  # (a node file may repeat a node: one node)
    usable = set(slots.entries)
    assert slots.entries == ["n1", "n2"]
    one = [slots.take(1, 1, usable) for _ in range(3)]
    assert [g.nodes for g in one] == [("n1",)] * 3  # the fullest node that fits: n2 stays whole
    assert [g.accelerators for g in one] == [("0",), ("1",), ("2",)]
    two = slots.take(1, 2, usable)
    assert two == Grant(("n2",), ("0", "1"))  # n1 has one left: the pair goes to n2
    assert slots.take(1, 4, usable) is None  # a whole-node stage: no node is whole now
    assert slots.take(2, 4, usable) is None
    slots.give_back(two)
    assert slots.take(1, 4, usable) == Grant(("n2",))
    assert slots.take(1, 1, usable) == Grant(("n1",), ("3",))
    assert slots.held("n1") == list(ACCELERATORS)
    for grant in one:
        slots.give_back(grant)
    assert slots.held("n1") == ["3"] and slots.take(1, 1, {"n1"}) == Grant(("n1",), ("0",))
    assert slots.take(1, 1, set()) is None  # (lost and spare nodes are not usable)


def test_without_accelerators_each_entry_of_the_node_list_is_a_slot():
    slots = Slots(["vm", "vm"])  # the local site on a machine without GPUs: local_slots entries
    usable = set(slots.entries)
    first, second = slots.take(1, 2, usable), slots.take(1, 2, usable)
    assert {Slots.name(e) for e in first.nodes + second.nodes} == {"vm"} and first.nodes != second.nodes
    assert first.accelerators == () and slots.take(1, 2, usable) is None
    one_gpu = Slots(["vm", "vm"], ("0",))  # the local site on a one-GPU machine: local_slots 2, one GPU
    assert one_gpu.take(1, 1, set(one_gpu.entries)) == Grant(("vm",))
    assert one_gpu.take(1, 1, set(one_gpu.entries)) is None  # the second one-GPU stage waits for the first


def test_a_stage_that_shares_its_node_gets_the_cores_of_its_accelerators_whoever_binds():
    share = CpuShare((1, 2), 4)
    assert CpuShare.parse(str(share)) == share and CpuShare.parse("4/4") is None and CpuShare.parse("") is None
    assert [share.block(r, range(32)) for r in (0, 1)] == [list(range(8, 16)), list(range(16, 24))]
    assert CpuShare((3,), 4).block(0, [0, 1]) == [1]  # fewer cores than accelerators: neighbours share one
    py = ["/venv/bin/python", "-m", "parsl_torch.launch.shim", "--", "train.py"]
    # Polaris: the whole node's depth binding would put every stage on cores 0-15; GPU 1 has 16-23
    polaris = MACHINES["polaris"]
    argv, env = bound(["mpiexec", "-n", "2", *polaris.binding_args(2), *py], share, polaris, 64)
    assert argv == ["mpiexec", "-n", "2", "--cpu-bind", "list:16-23:8-15", *py] and env == {"PARSL_TORCH_CPU_SHARE": ""}
    aurora = MACHINES["aurora"]  # tiles 1 and 2: ALCF's 12-rank list's second and third blocks
    argv, _ = bound(["mpiexec", *aurora.binding_args(2), *py], share, aurora, 208)
    assert argv == ["mpiexec", "--pmi=pmix", "--cpu-bind", "list:9-16:17-24", *py]
    # srun: Slurm gives the job's concurrent steps disjoint cores, a quarter of the node each
    argv, env = bound(["srun", "--ntasks", "2", *py], share, None, 64)
    assert argv[:4] == ["srun", "--exact", "--cpus-per-task", "16"] and env == {"PARSL_TORCH_CPU_SHARE": ""}
    frontier = MACHINES["frontier"]  # its binding already says 7 cores a rank
    argv, _ = bound(["srun", *frontier.binding_args(2), *py], share, frontier, 64)
    assert argv.count("--cpus-per-task") == 1 and argv[:2] == ["srun", "--exact"]
    # an mpiexec that does not bind (the local site): each rank's shim pins itself
    argv, env = bound(["mpiexec", "-n", "2", *py], share, None, 4)
    assert argv == ["mpiexec", "-n", "2", *py] and env == {"PARSL_TORCH_CPU_SHARE": "1,2/4"}
    # flags of the user's own (launch.extra_args) are left as they are: the shims pin
    argv, env = bound(["mpiexec", "--cpu-bind", "core", *py], share, polaris, 64)
    assert "core" in argv and env == {"PARSL_TORCH_CPU_SHARE": "1,2/4"}


@pt.distributed_app(ranks_per_node=1)
def trial(i: int, hold: float):
    import socket
    import time

    seen = {"i": i, "host": socket.gethostname(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "cores": sorted(os.sched_getaffinity(0)), "start": time.time()}
    time.sleep(hold)
    seen["end"] = time.time()
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_one_accelerator_trials_pack_a_node_that_declares_four(tmp_path, monkeypatch, warm):
    (tmp_path / "sites").mkdir()
    (tmp_path / "sites" / "four.yaml").write_text(
        "name: four\nscheduler: local\nlaunch:\n  accelerators: ['0', '1', '2', '3']\n")
    monkeypatch.setenv("PARSL_TORCH_SITE_PATH", str(tmp_path / "sites"))
    monkeypatch.chdir(tmp_path)
    with pt.workflow(site="four", run_dir="runs", warm=warm) as wf:  # (a walltime: a stuck trial fails, no hang)
        seen = [f.result(timeout=300) for f in [trial(i, 3.0, stage=f"t{i}", walltime=120) for i in range(8)]]
        whole = trial(8, 0.0, stage="whole", ranks_per_node=4, walltime=120).result(timeout=300)
    if warm:  # a group keeps its accelerator and takes the next call when it is free first: not always 2 each
        assert set(s["visible"] for s in seen) <= set(ACCELERATORS) and len({s["visible"] for s in seen}) >= 2
    else:
        assert sorted(s["visible"] for s in seen) == sorted(ACCELERATORS * 2)  # each trial holds one of its own
    for a in seen:  # never two trials on one accelerator at once
        for b in seen:
            if a is not b and a["visible"] == b["visible"]:
                assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)
    together = max(sum(a["start"] < b["end"] and b["start"] < a["end"] for b in seen) for a in seen)
    assert together >= 2, "the trials ran one at a time"  # (4 at once, where 2 cores keep up)
    assert whole["visible"] is None  # a stage of the whole node sees every accelerator
    cores = whole["cores"]  # and has every core; a trial has the cores of its accelerator's quarter
    for s in seen:
        assert s["cores"] == CpuShare((int(s["visible"]),), 4).block(0, cores), (s, cores)
    if len(cores) >= 4:
        assert len({tuple(s["cores"]) for s in seen}) == 4
    if not warm:  # (a warm group's supervisor writes in the group's directory)
        stderr = (wf.run_dir / "t0" / "stderr.txt").read_text()
        assert "this stage shares node" in stderr and "(CUDA_VISIBLE_DEVICES)" in stderr
        record = json.loads((wf.run_dir / "t0" / ".block.json").read_text())
        assert record["accelerators"] == f"CUDA_VISIBLE_DEVICES={seen[0]['visible']}"


def _task(tid: int, num_nodes: int, ranks_per_node: int) -> dict:
    return {"task_id": tid, "context": {"resource_spec": {"num_nodes": num_nodes, "ranks_per_node": ranks_per_node,
                                                          "num_ranks": num_nodes * ranks_per_node}}}


def test_the_pool_places_in_the_order_stages_came_so_a_whole_node_stage_is_not_starved(tmp_path, monkeypatch):
    import pickle
    import queue

    from parsl_torch.launch.packing import ACCELERATORS_KEY, CPU_SHARE_KEY, SHORT_KEY
    from parsl_torch.launch.pool import scheduler_class

    (tmp_path / "nodes").write_text("n1\n")
    monkeypatch.setenv("PBS_NODEFILE", str(tmp_path / "nodes"))
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    started, results = queue.Queue(), queue.Queue()
    pool = scheduler_class(str(tmp_path / "quarantine.json"), 0, ACCELERATORS, "ZE_AFFINITY_MASK")(started, results)

    def running() -> dict[int, dict]:
        out = {}
        while not started.empty():
            task = started.get()
            out[task["task_id"]] = task["context"]["resource_spec"]
        return out

    def finish(tid: int) -> None:
        results.put(pickle.dumps({"type": "result", "task_id": tid}))
        pool.get_result(timeout=1)

    pool.put_task(_task(1, 1, 2))  # half the node
    pool.put_task(_task(2, 1, 4))  # the whole node: waits for the half
    pool.put_task(_task(3, 1, 1))  # would fit beside the first, but comes after the whole-node stage
    now = running()
    assert list(now) == [1] and now[1][ACCELERATORS_KEY] == "ZE_AFFINITY_MASK=0,1" and now[1][SHORT_KEY] == ""
    assert now[1][CPU_SHARE_KEY] == "0,1/4"  # and the cores that go with them
    finish(1)
    now = running()
    assert list(now) == [2] and now[2][ACCELERATORS_KEY] == now[2][CPU_SHARE_KEY] == "" and now[2]["MPI_NODELIST"] == "n1"
    finish(2)
    third = running()[3]
    assert third[ACCELERATORS_KEY] == "ZE_AFFINITY_MASK=0" and third[CPU_SHARE_KEY] == "0/4"
    pool.put_task(_task(4, 2, 4))  # more nodes than the block has: fails at once, saying why
    assert "the stage needs 2 node(s) but its block has 1 left" in running()[4][SHORT_KEY]


def test_status_shows_the_accelerators_a_running_stage_holds(tmp_path):
    import time

    from parsl_torch.apps.session import status
    from parsl_torch.common import stagedir

    (tmp_path / "status.json").write_text(json.dumps({"stages": {"t0": {"state": "waiting", "submitted_at": 1.0}}}))
    (tmp_path / "t0").mkdir()
    (tmp_path / "t0" / stagedir.STARTED).write_text("")
    stagedir.write(tmp_path / "t0" / stagedir.BLOCK, stagedir.BlockRecord("0", None, None, time.time(), False,
                                                                        "CUDA_VISIBLE_DEVICES=2,3"))
    _, rows = status.read(tmp_path)
    assert rows[0].state == "running" and rows[0].progress == "on accelerator(s) 2,3 (CUDA_VISIBLE_DEVICES)"


def test_a_blocks_pool_knows_its_nodes_accelerators_and_machine():
    from parsl_torch import sites
    from parsl_torch.sites.build import pool_command

    command = pool_command("/runs/q.json", sites.load("polaris", account="X").spec)
    assert "--accelerators 0,1,2,3 --visibility CUDA_VISIBLE_DEVICES --machine polaris " in command


@pt.distributed_app(ranks_per_node=1)
def gpu_trial(i: int, hold: float):
    import time

    import torch

    start = time.time()
    x = torch.ones(1024, 1024, device="cuda")  # holds the GPU: a real allocation on it
    time.sleep(hold)
    return {"i": i, "gpus": torch.cuda.device_count(), "sum": float(x.sum()), "start": start, "end": time.time(),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


@pytest.mark.gpu
@pytest.mark.slow
def test_two_one_gpu_stages_on_a_one_gpu_machine_run_one_after_the_other(tmp_path, monkeypatch):
    import torch

    if torch.cuda.device_count() != 1:
        pytest.skip("needs a machine with exactly one GPU")
    monkeypatch.chdir(tmp_path)
    with pt.workflow(site="local", run_dir="runs"):
        a, b = (f.result(timeout=300) for f in [gpu_trial(i, 3.0, stage=f"g{i}") for i in range(2)])
    assert a["gpus"] == b["gpus"] == 1 and a["sum"] == b["sum"] == 1024.0 * 1024
    assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)  # never both on the GPU at once
