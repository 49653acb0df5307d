"""A warm rank's prepared parent (``apps.warm.rank``), without a workflow: what it must not hold when it
forks a call, and how its ranks' reports become the call's outcome (worded as a cold launch's)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parsl_torch.apps.stage.options import ShippedFunction
from parsl_torch.apps.warm.rank import JOBS, call_outcome, job_path
from parsl_torch.common import stagedir
from parsl_torch.common.blocks import CONTINUE_EXIT
from parsl_torch.common.entrypoints import WARM_RANK
from parsl_torch.common.outcome import Cause
from parsl_torch.common.raised import claim_first, first_claimed, write_raised
from parsl_torch.common.stagedir import WarmReport

from .conftest import REPO, clean_env

FORK_RULES = """
import importlib
import threading

import torch.distributed as dist

from parsl_torch.apps.stage.kept import PRELOAD, fork_safe

for name in PRELOAD:  # what a warm rank's parent holds when it forks
    importlib.import_module(name)
fork_safe()
stop = threading.Event()
thread = threading.Thread(target=stop.wait, name="left-running")
thread.start()
try:
    fork_safe()
except RuntimeError as exc:
    print(exc)
stop.set()
thread.join()
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    fork_safe()
except RuntimeError as exc:
    print(exc)
"""


@pytest.mark.slow  # (torch and the preloads: 6 s of CPU)
def test_a_warm_parent_forks_only_without_threads_process_groups_or_accelerator_contexts():
    """The parent's preloads leave it fit to fork (no thread, no process group, no CUDA or XPU context);
    what would make a fork unsafe is refused, naming it. (In a process of its own: pytest's have threads.)"""
    out = subprocess.run([sys.executable, "-c", FORK_RULES], env=clean_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "a warm rank's parent must not fork with threads running: left-running",
        "a warm rank's parent must not fork with a process group: its children make their own"]


def test_a_failed_warm_call_names_the_rank_that_failed_first_not_the_ranks_it_took_down():
    """Rank 1 raised; rank 0's collective then broke (exit 1, before its parent stopped it) and rank 2 was
    stopped by its parent: the call's error is rank 1's, as a cold supervisor's would be."""
    reports = [WarmReport(1, "n1", "RuntimeError: Connection closed by peer"),
               WarmReport(1, "n1", "ValueError: rank one gives up"), WarmReport(-15, "n2", stopped="peer")]
    outcome = call_outcome(reports, None, first=1, continues=False)
    assert (outcome.cause, outcome.exit_code, outcome.rank, outcome.host) == (Cause.RANK_FAILED, 1, 1, "n1")
    assert outcome.summary == "rank 1 on n1 raised ValueError: rank one gives up"
    killed = call_outcome([WarmReport(0, "n1"), WarmReport(-9, "n2")], None, first=1, continues=False)
    assert killed.summary == "rank 1 on n2 was killed by SIGKILL"
    # rank 1 SIGKILLed: rank 0's collective broke at once, and its parent reported first (seen on two nodes)
    peer_first = call_outcome([WarmReport(1, "n1", "RuntimeError: Connection closed by peer [10.77.0.12]:63203"),
                               WarmReport(-9, "n2")], None, first=0, continues=False)
    assert peer_first.summary == "rank 1 on n2 was killed by SIGKILL"


def test_a_fork_killed_from_outside_while_its_parent_stops_it_for_a_peer_is_killed_not_stopped(tmp_path):
    """The race of a 2-node warm call (seen in a clean-clone run): rank 1's fork is SIGKILLed, rank 0's
    collective breaks and rank 0 claims the failure first, and rank 1's parent sees that claim before it
    sees its own fork's end, so it 'stops' a fork that a SIGKILL from outside had ended. Its report must
    say killed (it is the call's cause), not stopped; a fork that its parent's SIGTERM ends stays stopped."""
    from types import SimpleNamespace

    from parsl_torch.apps.warm.rank import _Parent

    parent = SimpleNamespace(dir=str(tmp_path), rank=1)
    job = SimpleNamespace(walltime=None)
    (tmp_path / JOBS).mkdir()
    claim_first(job_path(tmp_path, 0, "failed"), 0)  # (rank 0 claimed first)
    for own_kill, expected in ((True, (-9, "")), (False, (-15, "peer"))):
        pid = os.fork()
        if pid == 0:  # the fork: deaf to its parent's SIGTERM when a SIGKILL from outside is to end it
            import signal

            signal.signal(signal.SIGTERM, signal.SIG_IGN if own_kill else signal.SIG_DFL)
            if own_kill:
                time.sleep(0.5)
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(30)
            os._exit(0)
        assert _Parent._wait(parent, 0, job, pid) == expected


def test_the_fork_that_raised_claims_the_first_failure_before_its_peers_collectives_break(tmp_path, monkeypatch):
    """A warm call's fork claims the call's first failure as its code raises, before its process ends (which
    breaks its peers' collectives): a peer's parent that saw its own child end first claims too late (this
    session's CI once named rank 0's "Connection reset by peer" instead of rank 1's ValueError)."""
    failed = tmp_path / "3.failed"
    monkeypatch.setenv("PARSL_TORCH_FIRST_FAILURE", f"1:{failed}")
    write_raised(ValueError("rank one gives up"), str(tmp_path / "raised"))
    claim_first(failed, 0)  # rank 0's parent, once its child's broken collective ended it
    assert first_claimed(failed) == 1 and first_claimed(tmp_path / "none") is None
    assert (tmp_path / "raised").read_text() == "ValueError: rank one gives up"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3.failed", "raised"]  # whole, and no temporary left


def test_a_warm_call_that_finished_timed_out_or_stopped_for_its_blocks_end_ends_as_a_cold_one():
    assert call_outcome([WarmReport(0, "n1"), WarmReport(0, "n1")], None, first=None, continues=False) is None
    timed_out = call_outcome([WarmReport(-15, "n1", stopped="walltime"), WarmReport(-15, "n1", stopped="walltime")],
                             3.0, first=None, continues=False)
    assert (timed_out.cause, timed_out.exit_code, timed_out.summary) == (Cause.TIMED_OUT, 124,
                                                                         "timed out after 3 s")
    continued = call_outcome([WarmReport(CONTINUE_EXIT, "n1"), WarmReport(CONTINUE_EXIT, "n2")], None, first=None,
                             continues=True)
    assert (continued.cause, continued.exit_code) == (Cause.CONTINUED, CONTINUE_EXIT)
    # an exit 99 that no block's end and no pt.to_be_continued() asked for is a rank's failure, as cold
    unasked = call_outcome([WarmReport(CONTINUE_EXIT, "n1"), WarmReport(0, "n2")], None, first=None, continues=False)
    assert (unasked.cause, unasked.rank, unasked.exit_code) == (Cause.RANK_FAILED, 0, CONTINUE_EXIT)
    assert "neither happened" in unasked.summary


def _answer(x: int) -> int:
    return x + 1


def _hold(marker: str) -> None:
    import time

    Path(marker).write_text(str(os.getpid()))
    time.sleep(300)


def _job(group: Path, n: int, stage: Path, fn, *args) -> None:
    """Job ``n`` as the workflow leaves it: the stage's payload and environment, then the job file."""
    import dill

    stage.mkdir(parents=True)
    with open(stage / stagedir.PAYLOAD, "wb") as f:
        dill.dump((ShippedFunction.of(fn), args, {}), f)
    (stage / stagedir.ENV).write_text("{}")
    stagedir.write(job_path(group, n), stagedir.WarmJob(str(stage)))


@pytest.mark.slow
def test_a_warm_parent_answers_a_job_and_its_fork_dies_with_it(tmp_path):
    """One rank's parent driven by hand through the group's files: job 0's fork answers (its value in
    the stage's result, an empty outcome); job 1's fork is left holding, the parent is SIGKILLed: the fork
    ends with it (PDEATHSIG), as a rank ends with its launch."""
    group = tmp_path / "group"
    (group / JOBS).mkdir(parents=True)
    env = clean_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                    PYTHONPATH=str(REPO))
    parent = subprocess.Popen([sys.executable, "-m", WARM_RANK, str(group)], env=env, stderr=subprocess.PIPE,
                              text=True)
    try:
        _job(group, 0, tmp_path / "a", _answer, 41)
        done = job_path(group, 0, "done")
        _wait(lambda: done.exists() or parent.poll() is not None, 120)
        assert done.read_text() == "" and dill_load(tmp_path / "a" / stagedir.RESULT) == 42
        marker = tmp_path / "held"
        _job(group, 1, tmp_path / "b", _hold, str(marker))
        _wait(lambda: marker.exists() and marker.read_text() or parent.poll() is not None, 120)
        child = int(marker.read_text())
        parent.kill()
        parent.wait()
        _wait(lambda: not Path(f"/proc/{child}").exists(), 10)
    finally:
        parent.kill()
        parent.communicate()


def _wait(ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"not within {timeout:g} s"
        time.sleep(0.05)


def dill_load(path: Path):
    import dill

    with open(path, "rb") as f:
        return dill.load(f)
