"""The suite's own cost accounting (tests/timings.py): the per-file table and the limits too close to
what a test takes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .timings import _accounting, table, too_close


def _run(path, elapsed: float, tests: list[dict]) -> str:
    path.write_text(json.dumps({"elapsed": elapsed, "cpus": 2, "tests": tests}))
    return str(path)


def test_the_table_sums_each_file_and_says_how_much_of_its_time_was_work(tmp_path):
    before = _run(tmp_path / "a.json", 100, [
        {"test": "tests/test_a.py::test_x", "wall": 60.0, "cpu": 15.0, "busy": 60.0},
        {"test": "tests/test_a.py::test_y[1]", "wall": 20.0, "cpu": 5.0, "busy": 20.0},
        {"test": "tests/test_b.py::test_z", "wall": 10.0, "cpu": 1.0, "cpu_all": 10.0, "busy": 20.0}])
    after = _run(tmp_path / "b.json", 40, [
        {"test": "tests/test_a.py::test_x@cluster", "wall": 30.0, "cpu": 15.0, "busy": 30.0}])
    lines = table([before, after]).splitlines()
    assert lines[0].startswith("| file | tests1 | wall s1 | cpu s1 | cpu/wall1 | machine busy1 | tests2 |")
    assert lines[2] == "| tests/test_a.py | 2 | 80 | 20 | 25% | 50% | 1 | 30 | 15 | 50% | 50% |"  # the slowest first
    # (all the test started, where a cgroup counted it, over what it reaped)
    assert lines[3] == "| tests/test_b.py | 1 | 10 | 10 | 100% | 100% |  |  |  |  |  |"  # not in the second run
    assert lines[4].startswith("| **all** | 3 | 90 (in 100 elapsed) | 30 | 33% |")


BUSY_DETACHED = """
import os, subprocess, sys, time
from tests.timings import _enter, _leave, cpu_all
first, second = _enter("t0"), _enter("t1")
assert first != second  # a cgroup per test
cgroup = _enter("t")
cpu_all(str(first)), cpu_all(str(second))  # (removed: nothing runs in them any more)
busy = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1: pass"
child = subprocess.Popen([sys.executable, "-c", busy], start_new_session=True)  # as Parsl's pools: nobody reaps it
_leave()
child.wait()
print(cpu_all(str(cgroup)), cgroup.exists())
"""


@pytest.mark.skipif(_accounting() is None, reason="a cgroup per test needs root and a cgroup file system")
def test_a_tests_cgroup_counts_what_it_started_and_nobody_reaped():
    out = subprocess.run([sys.executable, "-c", BUSY_DETACHED], capture_output=True, text=True, check=True,
                         timeout=60).stdout.split()
    assert 1.0 <= float(out[0]) < 5 and out[1] == "False", out  # counted once it ended, and removed


def test_a_wait_below_three_times_the_test_is_named_and_a_promise_is_not(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_w.py").write_text(
        "import subprocess, time\n"
        "def test_close():\n    subprocess.run(['true'], timeout=20)\n"
        "def test_deadline():\n    deadline = time.monotonic() + 25\n"
        "def test_roomy():\n    subprocess.run(['true'], timeout=300)\n"
        "def test_promise():\n    took = 3\n    assert took < 5\n"
        "def test_nothing_comes():\n    q.get(timeout=25)\n    with pytest.raises(queue.Empty):\n"
        "        q.get(timeout=1)\n")  # (a wait meant to run out is no limit; the one before it is)
    records = [{"test": f"tests/test_w.py::{name}", "wall": 10.0}
               for name in ("test_close", "test_deadline[a]", "test_roomy@g", "test_promise", "test_nothing_comes")]
    said = too_close(records, timeout=900, root=tmp_path)
    assert [line.split(":")[2] for line in said] == ["test_close", "test_deadline[a]", "test_nothing_comes"], said
    assert "a limit of 20 s" in said[0] and "a limit of 25 s" in said[1] and "a limit of 25 s" in said[2]
    assert too_close(records[3:4], timeout=20, root=tmp_path)  # pytest-timeout bounds every test
