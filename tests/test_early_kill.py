"""A workflow killed at any instant of its life, even while Parsl is still starting, leaves
no process behind: everything it started carries its token from its first instant, and its
watchdog kills what carries it when the workflow's pipe closes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from .conftest import clean_env, processes_under

HOLD = """
import sys, time
import parsl_torch as pt
with pt.workflow(site="local", run_dir=sys.argv[1]):
    print("holding", flush=True)
    time.sleep(60)
"""
#: seconds within which every process a killed workflow started is gone (README: "When a workflow dies")
BOUND_S = 15.0
#: (seconds after the process started, or after it printed "holding")
INSTANTS = [("start", t) for t in (0.3, 0.8, 1.2, 1.6, 2.0, 2.5)] + [("holding", t) for t in (0.0, 0.1, 0.3, 0.6)]


@pytest.mark.slow
def test_a_workflow_killed_at_any_instant_of_its_start_leaves_no_process(tmp_path):
    script = tmp_path / "hold.py"
    script.write_text(HOLD)
    left, slowest = {}, 0.0
    for i, (since, delay) in enumerate(INSTANTS):
        where = tmp_path / f"kill-{i}"
        where.mkdir()
        proc = subprocess.Popen([sys.executable, str(script), str(where / "run")], cwd=where, env=clean_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if since == "holding":
            assert proc.stdout.readline() == b"holding\n"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        killed = time.monotonic()
        while (found := processes_under(where)) and time.monotonic() - killed < BOUND_S:
            time.sleep(0.2)
        slowest = max(slowest, time.monotonic() - killed)
        if found:
            left[f"{delay} s after {since}"] = found
            for pid in found:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left {BOUND_S:g} s after the workflow was killed: {left}"
    print(f"every process gone within {slowest:.1f} s of the kill")
