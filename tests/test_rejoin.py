"""Ranks kept up through a lost node, in parts: the word's way from the supervisor to a node's ranks
(``launch.rejoin``: the listener, the node's first shim, the node file) and a kept rank's parent, which forks
its run anew at each rejoin (``apps.stage.kept``). The whole, with a node lost on the test cluster:
``test_multinode``."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from parsl_torch.core.topology import Topology
from parsl_torch.launch import rejoin
from parsl_torch.launch.listener import RankListener
from parsl_torch.launch.shim import Heartbeat

KEPT = textwrap.dedent("""
    import json, os, sys, time
    from parsl_torch.apps.stage.kept import _Kept

    def attempt():
        with open(sys.argv[1], "a") as f:
            f.write(json.dumps({k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT")}) + "\\n")
        if os.environ.get("MASTER_PORT") == "1000":
            time.sleep(600)  # (a collective waiting on the lost node)
        return 3

    sys.exit(_Kept(attempt).run())
""")


def _until(predicate, what: str, limit: float = 60.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if (found := predicate()):
            return found
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {limit:g} s")


def _kept(tmp_path: Path, token: str, **env: str) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "children.jsonl"
    script = tmp_path / "kept.py"
    script.write_text(KEPT)
    base = {"PARSL_TORCH_LAUNCH_NOTIFY": f"127.0.0.1:1:{token}", "RANK": "0", "WORLD_SIZE": "2",
            "MASTER_PORT": "1000", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    return subprocess.Popen([sys.executable, str(script), str(log)], env={**os.environ, **base, **env}), log


def _lines(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_kept_rank_forks_its_run_anew_at_a_rejoin_whatever_its_child_waits_for(tmp_path):
    """The child hangs (as in a collective with a lost node); the rejoin ends it and the parent forks a new one
    with the new rank and rendezvous; that one fails (code 3), which the parent reports after HOLD_S."""
    token = f"test{os.getpid()}a"
    proc, log = _kept(tmp_path, token)
    try:
        _until(lambda: _lines(log), "first child")
        rejoin.take(rejoin.Rejoin(1, "127.0.0.1", 2000, 4, {socket.gethostname().split(".")[0]: 2}).line(), token)
        assert proc.wait(timeout=60) == 3
    finally:
        proc.kill()
        rejoin.forget(token)
    assert _lines(log) == [{"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1000"},
                           {"RANK": "2", "WORLD_SIZE": "4", "MASTER_PORT": "2000"}]


def test_a_spares_waiting_rank_forks_nothing_until_it_takes_a_lost_nodes_rank(tmp_path):
    token = f"test{os.getpid()}b"
    proc, log = _kept(tmp_path, token, PARSL_TORCH_STANDBY="1")
    try:
        time.sleep(1.0)
        assert proc.poll() is None and not _lines(log)
        here = socket.gethostname().split(".")[0]
        elsewhere = rejoin.Rejoin(1, "127.0.0.1", 3000, 4, {"elsewhere": 0})
        rejoin.take(elsewhere.line(), token)  # (not this node: it goes on waiting)
        time.sleep(0.5)
        assert not _lines(log)
        rejoin.take(rejoin.Rejoin(2, "127.0.0.1", 3001, 4, {"elsewhere": 0, here: 3}).line(), token)
        assert proc.wait(timeout=60) == 3
    finally:
        proc.kill()
        rejoin.forget(token)
    assert _lines(log) == [{"RANK": "3", "WORLD_SIZE": "4", "MASTER_PORT": "3001"}]


def test_the_word_goes_from_the_supervisor_to_its_nodes_file_and_leaves_with_the_node(monkeypatch):
    """The listener sends a rejoin down a node's heartbeat connection; the node's first shim writes it for
    the node's ranks, and removes it when it ends. A spare's waiting ranks say so in their hello."""
    monkeypatch.setenv("PARSL_TORCH_STANDBY", "1")
    listener = RankListener(queue.Queue(), node_timeout=30)
    host = socket.gethostname()
    beat = Heartbeat(listener.address, Topology(4, 0, 6, 2, 3, (host,), None, None, "mpich", host))
    token = rejoin.token_of(listener.address)
    try:
        _until(lambda: host.split(".")[0] in listener.waiting, "hello as a spare")
        word = rejoin.Rejoin(1, "n1", 4000, 6, {"n1": 0, host.split(".")[0]: 2})
        listener.adopt(host, (2, 3))
        assert listener.send(host, word.line()) and not listener.send("gone", word.line())
        assert _until(lambda: rejoin.read(token), "rejoin on the node") == word
        assert word.rank_env(host, 1, 2, {}) == {"RANK": "3", "WORLD_SIZE": "6", "GROUP_RANK": "1", "MASTER_ADDR": "n1",
                                                 "MASTER_PORT": "4000", "PARSL_TORCH_SHIM_SOURCE": "rejoin:3:6"}
        in_a_step = word.rank_env(host, 1, 2, {"SLURM_STEP_NODELIST": "n[1-2]"})  # (the step's nodes now)
        assert in_a_step["SLURM_STEP_NODELIST"] == f"n1,{host.split('.')[0]}"
    finally:
        beat.close()
        listener.close()
    assert rejoin.read(token) is None and not rejoin.node_file(token).exists()
    assert host.split(".")[0] in listener.greeted and host.split(".")[0] not in listener.waiting
