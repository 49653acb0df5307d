"""Stages smaller than a node share it, each on its own accelerators (``launch.packing``, placed by
parsl-torch's worker pool): on a site whose nodes declare accelerators, so no GPU is needed."""

from __future__ import annotations

import json
import os

import pytest

import parsl_torch as pt
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


@pt.distributed_app(ranks_per_node=1)
def trial(i: int, hold: float):
    import socket
    import time

    seen = {"i": i, "host": socket.gethostname(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "start": time.time()}
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
    with pt.workflow(site="four", run_dir="runs", warm=warm) as wf:
        seen = [f.result(timeout=300) for f in [trial(i, 3.0, stage=f"t{i}") for i in range(8)]]
        whole = trial(8, 0.0, stage="whole", ranks_per_node=4).result(timeout=300)
    assert sorted(s["visible"] for s in seen) == sorted(ACCELERATORS * 2)  # each trial holds one of its own
    for a in seen:  # never two trials on one accelerator at once
        for b in seen:
            if a is not b and a["visible"] == b["visible"]:
                assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)
    together = max(sum(a["start"] < b["end"] and b["start"] < a["end"] for b in seen) for a in seen)
    assert together >= 2, "the trials ran one at a time"  # (4 at once, where 2 cores keep up)
    assert whole["visible"] is None  # a stage of the whole node sees every accelerator
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

    from parsl_torch.launch.pool import ACCELERATORS_KEY, SHORT_KEY, scheduler_class

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
    finish(1)
    now = running()
    assert list(now) == [2] and now[2][ACCELERATORS_KEY] == "" and now[2]["MPI_NODELIST"] == "n1"
    finish(2)
    assert running()[3][ACCELERATORS_KEY] == "ZE_AFFINITY_MASK=0"
    pool.put_task(_task(4, 2, 4))  # more nodes than the block has: fails at once, saying why
    assert "the stage needs 2 node(s) but its block has 1 left" in running()[4][SHORT_KEY]


def test_status_shows_the_accelerators_a_running_stage_holds(tmp_path):
    import time

    from parsl_torch.apps import status
    from parsl_torch.common import stagedir

    (tmp_path / "status.json").write_text(json.dumps({"stages": {"t0": {"state": "waiting", "submitted_at": 1.0}}}))
    (tmp_path / "t0").mkdir()
    (tmp_path / "t0" / stagedir.STARTED).write_text("")
    stagedir.write(tmp_path / "t0" / stagedir.BLOCK, stagedir.BlockRecord("0", None, None, time.time(), False,
                                                                        "CUDA_VISIBLE_DEVICES=2,3"))
    _, rows = status.read(tmp_path)
    assert rows[0].state == "running" and rows[0].progress == "on accelerator(s) 2,3 (CUDA_VISIBLE_DEVICES)"
