"""The state kept in node memory (``core.snapshot``): which step a retry resumes at, and from whom each
rank gets its state, decided from what each node's memory holds (the runs: test_workflow, test_multinode)."""

from __future__ import annotations

from parsl_torch.core.snapshot import _newest


def held(*entries: tuple[str, int, int]) -> dict:
    return {entry: f"/dev/shm/{entry}" for entry in entries}


def test_a_sharded_state_resumes_at_the_newest_step_every_rank_can_get_from_the_nodes_left():
    # 4 ranks, 2 per node; node 2 (ranks 2, 3) lost: ranks 0, 1 hold their own states and the copies of 2, 3
    # (at step 6; the copies of step 7 never arrived), the spare's ranks 2, 3 hold nothing
    left = held(("rank", 0, 7), ("rank", 1, 7), ("rank", 0, 6), ("rank", 1, 6), ("peer", 2, 6), ("peer", 3, 6))
    assert _newest([left, left, {}, {}], 4, replicated=False) == (6, {2: 0, 3: 0})
    assert _newest([left, left, {}, {}], 4, replicated=True) == (7, {2: 0, 3: 0})  # any copy serves any rank
    assert _newest([{}, {}, {}, {}], 4, replicated=False) == (None, {})  # a new job: the file checkpoint


def test_a_state_no_rank_can_get_is_never_resumed():
    only_own = held(("rank", 0, 5), ("rank", 1, 5))  # no copies elsewhere: ranks 2, 3 lost theirs
    assert _newest([only_own, only_own, {}, {}], 4, replicated=False) == (None, {})
    assert _newest([only_own] * 2, 2, replicated=False) == (5, {})  # every rank on a node that holds its own
    # a node lost during a snapshot: of n1's pairs one exchanged step 8 (its older state gone), one did not
    half = held(("rank", 0, 8), ("peer", 2, 8), ("rank", 1, 6), ("peer", 3, 6))
    assert _newest([half, half, {}, {}], 4, replicated=False) == (None, {})  # (the file checkpoint serves)
    assert _newest([half, half, {}, {}], 4, replicated=True) == (8, {2: 0, 3: 0})  # (any rank's serves)


def test_the_launch_on_the_nodes_left_rewrites_only_parsls_prefix():
    """After a lost node, a stage whose min_nodes allows it goes on in place: the same command on the nodes
    left (or on a spare), the launcher's ranks and nodes rewritten (Parsl's prefixes), nothing else."""
    from parsl_torch.launch.nodeloss import on_nodes_left, on_spare

    tail = ["--bind-to", "core", "python", "-m", "parsl_torch.launch.shim", "-n", "4"]
    mpiexec = ["mpiexec", "-n", "6", "-ppn", "2", "-hosts", "n1,n2,n3"]
    assert on_nodes_left(mpiexec + tail, mpiexec, ["n1", "n2", "n3"], "n2", 2) == \
        (["mpiexec", "-n", "4", "-ppn", "2", "-hosts", "n1,n3", *tail], ["n1", "n3"])
    srun = ["srun", "--ntasks", "4", "--ntasks-per-node", "2", "--nodelist", "n1,n2", "--nodes", "2"]
    assert on_nodes_left(srun + tail, srun, ["n1", "n2"], "n1", 2) == \
        (["srun", "--ntasks", "2", "--ntasks-per-node", "2", "--nodelist", "n2", "--nodes", "1", *tail], ["n2"])
    assert on_nodes_left(["torchrun", *tail], ["torchrun"], ["n1", "n2"], "n2", 2) is None  # not Parsl's
    assert on_nodes_left(["mpiexec", "-n", "2", *tail], mpiexec, ["n1", "n2"], "n2", 2) is None  # another prefix
    assert on_nodes_left(mpiexec + tail, mpiexec, ["n1"], "n1", 2) is None  # no node left
    # with a spare of the block's, the same ranks: the spare in the lost node's place
    assert on_spare(mpiexec + tail, mpiexec, ["n1", "n2", "n3"], "n2", "n4", 2) == \
        (["mpiexec", "-n", "6", "-ppn", "2", "-hosts", "n1,n4,n3", *tail], ["n1", "n4", "n3"])
