"""Topology precedence over launcher environments (pure: no processes)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from parsl_torch.core.topology import (
    RENDEZVOUS_PORTS,
    expand_hostlist,
    free_port,
    resolve_master,
    topology_from_env,
)
from parsl_torch.errors import TopologyError


def topo(env, **kw):
    return topology_from_env(env, hostname="here", **kw)


def test_nothing_set_is_one_process():
    t = topo({})
    assert (t.rank, t.world_size, t.local_rank, t.num_nodes, t.rank_source) == (0, 1, 0, 1, "single")


def test_torchrun_env():
    t = topo({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
              "MASTER_ADDR": "n0", "MASTER_PORT": "1234"})
    assert (t.rank, t.world_size, t.local_rank, t.local_world_size, t.num_nodes) == (5, 8, 1, 4, 2)
    assert (t.master_addr, t.master_port, t.rank_source) == ("n0", 1234, "torchrun")


def test_torchrun_wins_over_an_enclosing_mpi_job():
    # one torchrun per node started by mpiexec: torchrun's world is the real one
    t = topo({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
              "PMI_RANK": "0", "PMI_SIZE": "2"})
    assert (t.rank_source, t.rank, t.world_size) == ("torchrun", 3, 8)


def test_pals_on_aurora(tmp_path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x4000c0s0b0n0\nx4000c0s0b0n0\nx4000c0s1b0n0\n")
    t = topo({"PALS_RANKID": "13", "PALS_LOCAL_RANKID": "1", "PMI_SIZE": "24", "PMI_RANK": "13",
              "PALS_LOCAL_SIZE": "12", "PBS_NODEFILE": str(nodefile), "PBS_JOBID": "1.aurora"})
    assert (t.rank_source, t.rank, t.local_rank, t.world_size, t.local_world_size) == ("pals", 13, 1, 24, 12)
    assert t.num_nodes == 2
    assert t.nodes == ("x4000c0s0b0n0", "x4000c0s1b0n0")  # deduplicated, in order


def test_mpich_hydra():
    t = topo({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert (t.rank_source, t.rank, t.local_rank, t.world_size, t.num_nodes) == ("mpich", 1, 1, 2, 1)


def test_openmpi():
    t = topo({"OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "8",
              "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})
    assert (t.rank_source, t.rank, t.local_rank, t.num_nodes) == ("openmpi", 6, 2, 2)


SLURM_STEP = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "9", "SLURM_LOCALID": "1",
              "SLURM_STEP_NUM_TASKS": "16", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
              "SLURM_STEP_NODELIST": "frontier[00010-00011]", "SLURM_NTASKS": "16"}


def test_slurm_job_step():
    t = topo(SLURM_STEP)
    assert (t.rank_source, t.rank, t.local_rank, t.world_size, t.local_world_size) == ("slurm", 9, 1, 16, 8)
    assert t.nodes == ("frontier00010", "frontier00011")
    assert resolve_master(t, SLURM_STEP).master_addr == "frontier00010"


def test_slurm_batch_shell_is_one_process():
    # sbatch's shell has SLURM_PROCID=0 and SLURM_NTASKS=16 but is not a rank
    batch = {k: v for k, v in SLURM_STEP.items() if k not in ("SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS")}
    batch["SLURM_PROCID"] = "0"
    t = topo(batch)
    assert (t.rank_source, t.world_size) == ("single", 1)


def test_srun_with_pmi2_takes_local_rank_from_slurm():
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
           "SLURM_LOCALID": "1", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
           "SLURM_NODEID": "1", "SLURM_STEP_NODELIST": "a,b"}
    t = topo(env)
    assert (t.rank_source, t.rank, t.local_rank, t.local_world_size, t.num_nodes) == ("mpich", 3, 1, 2, 2)


def test_hostlist_expansion():
    assert expand_hostlist("nid[001-003,007],login1") == ["nid001", "nid002", "nid003", "nid007", "login1"]
    assert expand_hostlist("a1,b[8-10]-ib") == ["a1", "b8-ib", "b9-ib", "b10-ib"]


@pytest.mark.parametrize("env, needle", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, "RANK=2 is not a rank"),
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "WORLD_SIZE": "4"}, "WORLD_SIZE=4"),
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "0"},
     "OMPI_COMM_WORLD_SIZE=3"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "2"}, "local rank 5"),
])
def test_inconsistent_environments_fail_clearly(env, needle):
    with pytest.raises(TopologyError, match=needle.replace("(", r"\(")):
        topo(env)


def test_master_from_env_is_kept():
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "4242"}
    t = resolve_master(topo(env), env)
    assert (t.master_addr, t.master_port) == ("10.0.0.1", 4242)


def test_single_node_without_mpi_uses_loopback_and_a_job_port():
    env = {"SLURM_STEP_ID": "3", "SLURM_JOB_ID": "12", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
           "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NODELIST": "n1"}
    a = resolve_master(topo(env), env)
    b = resolve_master(topo({**env, "SLURM_PROCID": "1", "SLURM_LOCALID": "1"}), env)
    assert a.master_addr == "127.0.0.1"
    assert a.master_port == b.master_port  # every rank derives the same port
    assert a.master_port in RENDEZVOUS_PORTS


def test_a_chosen_port_is_outside_the_ephemeral_range_reserved_from_other_launches_and_open_to_the_store():
    """Two launches on one node chose the same port between choosing it and rank 0 binding it (CI saw
    EADDRINUSE): a chosen port is refused to the next choice but open to rank 0's TCPStore."""
    from datetime import timedelta

    from torch.distributed import TCPStore
    lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == 20 and all(p < lo or p > hi for p in ports), (ports, lo, hi)
    for port in ports:
        with socket.socket() as s, pytest.raises(OSError):
            s.bind(("", port))  # what another launch's choice tries
    for use_libuv in (True, False):
        store = TCPStore("127.0.0.1", ports.pop(), 1, True, timeout=timedelta(seconds=10), use_libuv=use_libuv)
        store.set("k", "v")
        assert store.get("k") == b"v"
