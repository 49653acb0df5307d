"""A stage starts every time: no rank fails at start because a peer left early or a stage
before it was killed (issue: "Gloo connectFullMesh failed ... Connection closed by peer")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import BIN, RANKS_DIR, clean_env

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

#: launches of the late-rank script; without the barrier at the end of setup_torch 4 of 8 failed here
#: (6 launches miss that fault 1 time in 64)
LATE_RUNS = 6


def test_a_rank_that_leaves_at_once_does_not_fail_a_peer_still_joining():
    for attempt in range(LATE_RUNS):
        out = subprocess.run([str(BIN / "parsl-torch"), "launch", "-n", "2", "--", "python",
                              str(RANKS_DIR / "late_rank.py")], env=clean_env(), capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, f"launch {attempt + 1} of {LATE_RUNS}:\n{out.stderr[-3000:]}"


def test_short_stages_two_at_a_time_some_after_killed_ones_all_start(tmp_path):
    """The CI size of benchmarks/bench_start.py (200 stages there)."""
    out = subprocess.run([sys.executable, str(REPO / "tests" / "workflows" / "start_stress.py"),
                          str(tmp_path / "run"), "10"], env=clean_env(), capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["killed"] == 1 and summary["failed"] == [], summary
