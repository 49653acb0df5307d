"""A warm rank's prepared parent (``apps.warm.rank``), without a workflow: what it must not hold when it
forks a call, and how its ranks' reports become the call's outcome (worded as a cold launch's)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from parsl_torch.apps.warm.rank import call_outcome
from parsl_torch.common.blocks import CONTINUE_EXIT
from parsl_torch.common.outcome import Cause
from parsl_torch.common.stagedir import WarmReport

from .conftest import clean_env

FORK_RULES = """
import importlib
import threading

import torch.distributed as dist

from parsl_torch.apps.warm.rank import PRELOAD, fork_safe

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
    outcome = call_outcome(reports, None, first=1)
    assert (outcome.cause, outcome.exit_code, outcome.rank, outcome.host) == (Cause.RANK_FAILED, 1, 1, "n1")
    assert outcome.summary == "rank 1 on n1 raised ValueError: rank one gives up"
    killed = call_outcome([WarmReport(0, "n1"), WarmReport(-9, "n2")], None, first=1)
    assert killed.summary == "rank 1 on n2 was killed by SIGKILL"


def test_a_warm_call_that_finished_timed_out_or_stopped_for_its_blocks_end_ends_as_a_cold_one():
    assert call_outcome([WarmReport(0, "n1"), WarmReport(0, "n1")], None, first=None) is None
    timed_out = call_outcome([WarmReport(-15, "n1", stopped="walltime"), WarmReport(-15, "n1", stopped="walltime")],
                             3.0, first=None)
    assert (timed_out.cause, timed_out.exit_code, timed_out.summary) == (Cause.TIMED_OUT, 124,
                                                                         "timed out after 3 s")
    continued = call_outcome([WarmReport(CONTINUE_EXIT, "n1"), WarmReport(CONTINUE_EXIT, "n2")], None, first=None)
    assert (continued.cause, continued.exit_code) == (Cause.CONTINUED, CONTINUE_EXIT)
