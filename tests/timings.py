"""What each test costs: wall time, and how much of it the machine's cores were working.

Loaded by tests/conftest.py as a pytest plugin. For every test it records the wall time of its
three phases, the CPU time of the test's own process tree (this process and every child it
reaped: ranks, launchers), the CPU of everything the test started (``cpu_all``: as root, each test
runs in a cgroup of its own, so Parsl's detached pools and their ranks, which no test reaps, count
too, until they end; not what a scheduler's daemons start for it: srun's ranks, the test cluster's)
and the machine's busy CPU time over the same interval (/proc/stat: every process, daemons
included). A test whose CPU is far below its wall time is waiting (a scheduler's poll, a timeout, a
process's start), and waiting overlaps; one that keeps the cores busy does not.

``--timings-json PATH`` writes one record per test; at the end of the run the ten slowest tests
and the total are printed. ``python tests/timings.py PATH [PATH ...]`` prints the per-file table
again from such files (several: one column pair per run, e.g. before and after).
"""

from __future__ import annotations

import argparse
import ast
import functools
import itertools
import json
import os
import re
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

_CPUS = os.cpu_count() or 1


def _machine_busy() -> float:
    """Seconds of CPU the whole machine has spent working since boot (every core, every process)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _tree_cpu() -> float:
    """CPU seconds of this process and of every child it has reaped (their children included)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


# ---- everything a test started: a cgroup per test (root) ------------------------------------

_CPUACCT = Path("/sys/fs/cgroup/cpuacct")  # cgroup v1's CPU accounting (a v2-only machine: cpu.stat)
_V2 = Path("/sys/fs/cgroup")


@functools.cache
def _accounting() -> tuple[Path, str] | None:
    """Where this process's test cgroups go, and the file that holds a cgroup's CPU; None where that
    cannot be done (not root, no cgroup file system). Looked up once."""
    for base, usage in ((_CPUACCT, "cpuacct.usage"), (_V2, "cpu.stat")):
        if (base / usage).exists() or (base / "cgroup.controllers").exists():
            if os.access(base / "cgroup.procs", os.W_OK):
                return base, usage
    return None


def _usage(cgroup: Path, usage: str) -> float:
    """CPU seconds of every process that was in the cgroup, ended ones included."""
    text = (cgroup / usage).read_text()
    if usage == "cpu.stat":  # usage_usec N
        return int(text.split("usage_usec", 1)[1].split()[0]) / 1e6
    return int(text) / 1e9


def _enter(nodeid: str) -> Path | None:
    """This worker moves into a new cgroup for the test: what it starts is born there, and stays."""
    found = _accounting()
    if found is None:
        return None
    base, _ = found
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid()))[:12]
    cgroup = base / f"parsl-torch-tests-{run}" / f"{os.getpid()}-{next(_numbers)}"
    try:
        cgroup.mkdir(parents=True)
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return None
    _cgroups[nodeid] = cgroup
    return cgroup


def _leave() -> None:
    found = _accounting()
    if found is not None:
        (found[0] / "cgroup.procs").write_text(str(os.getpid()))


def cpu_all(cgroup: str) -> float | None:
    """The CPU of a test's cgroup, read by the controller at the end of the run (what its pools did
    after it ended counts), then the cgroup is removed if nothing runs in it any more."""
    path = Path(cgroup)
    found = _accounting()
    if found is None or not path.is_dir():
        return None
    seconds = _usage(path, found[1])
    try:
        path.rmdir()
        path.parent.rmdir()  # the run's folder, once its last test's is gone
    except OSError:
        pass
    return seconds


_cgroups: dict[str, Path] = {}
_numbers = itertools.count()


# ---- the pytest plugin --------------------------------------------------------------------

def pytest_addoption(parser) -> None:
    parser.addoption("--timings-json", default=None, metavar="PATH",
                     help="write each test's wall and CPU time to PATH (python tests/timings.py PATH "
                          "prints the per-file table)")


_started: dict[str, tuple[float, float, float]] = {}


def pytest_runtest_logstart(nodeid: str, location) -> None:
    _started[nodeid] = (time.monotonic(), _tree_cpu(), _machine_busy())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem) -> None:
    """In the process that runs the test (xdist's controller hears of its start too, but runs nothing)."""
    _enter(item.nodeid)


def pytest_runtest_makereport(item, call):
    """On the teardown report, the test's CPU and the machine's, carried to the controller (xdist)."""
    if call.when != "teardown" or item.nodeid not in _started:
        return None
    wall0, cpu0, busy0 = _started.pop(item.nodeid)
    cgroup = _cgroups.pop(item.nodeid, None)
    if cgroup is not None:
        _leave()
    item.user_properties.append(("timing", {
        "wall": time.monotonic() - wall0, "cpu": _tree_cpu() - cpu0, "busy": _machine_busy() - busy0,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "cgroup": str(cgroup) if cgroup else None}))
    return None


class _Collector:
    """In the controlling process: one record per test, the ten slowest at the end."""

    def __init__(self, config, timeout: float) -> None:
        self.config, self.path, self.timeout = config, config.getoption("--timings-json"), timeout
        self.records, self.started = {}, time.monotonic()

    def pytest_runtest_logreport(self, report) -> None:
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if report.failed and terminal is not None:  # at once: a long parallel run says it only at its end
            terminal.write_line(f"\nFAILED {report.nodeid} ({report.when}, after {report.duration:.0f} s)")
        record = self.records.setdefault(report.nodeid, {"test": report.nodeid, "outcome": "passed"})
        record[report.when] = report.duration
        if report.failed or (report.skipped and report.when != "teardown"):
            record["outcome"] = "failed" if report.failed else "skipped"
        for name, value in report.user_properties:
            if name == "timing":
                record.update(value)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.records:
            return
        elapsed = time.monotonic() - self.started
        records = sorted(self.records.values(), key=lambda r: -r.get("wall", 0.0))
        for r in records:
            if r.get("cgroup"):
                r["cpu_all"] = cpu_all(r.pop("cgroup"))
        write = terminalreporter.write_line
        terminalreporter.section("the ten slowest tests (wall s, CPU s of all the test started)")
        for r in records[:10]:
            write(f"{r.get('wall', 0):8.1f} {_cpu(r):8.1f}  {r['test']}")
        total = sum(r.get("wall", 0.0) for r in records)
        write(f"total: {len(records)} tests, {total:.0f} s of test time in {elapsed:.0f} s of wall time "
              f"({total / max(elapsed, 1e-9):.1f} tests at a time on average), {sum(map(_cpu, records)):.0f} s "
              f"of CPU")
        close = too_close(records, self.timeout, Path(str(terminalreporter.config.rootpath)))
        if close:
            terminalreporter.section(f"limits below {MARGIN}x of what the whole test took (raise those that bound "
                                     f"the test's main wait: docs/testing.md)")
            for line in close:
                write(line)
        if self.path:
            Path(self.path).write_text(json.dumps({"elapsed": elapsed, "cpus": _CPUS, "tests": records}))
            write(f"per test: {self.path} (python tests/timings.py {self.path} prints the table per file)")


def _remove_stale_cgroups() -> None:
    """Earlier runs' cgroups that a kill left behind (rmdir takes only those with no process left)."""
    found = _accounting()
    for run in found[0].glob("parsl-torch-tests-*") if found else ():
        for cgroup in [*run.glob("*-*/"), run]:
            try:
                cgroup.rmdir()
            except OSError:
                pass


def pytest_configure(config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        _remove_stale_cgroups()
        try:
            timeout = float(config.getini("timeout") or 0)  # pytest-timeout's, for every test
        except ValueError:
            timeout = 0.0
        config.pluginmanager.register(_Collector(config, timeout), "pt-timings")


# ---- limits too close to what a test takes ------------------------------------------------

MARGIN = 3  # a test's own limits are at least 3x what it takes: a loaded machine is no flake


def _expected_to_run_out(function: ast.AST) -> set[int]:
    """The nodes inside ``with pytest.raises(...)``: a wait there is meant to run out (``queue.Empty``:
    nothing came), and a loaded machine only makes it more sure to."""
    inside = set()
    for node in ast.walk(function):
        if isinstance(node, (ast.With, ast.AsyncWith)) and any(
                "pytest.raises" in ast.unparse(item.context_expr) for item in node.items):
            inside.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return inside


def _waits(function: ast.AST) -> list[float]:
    """The waits a test function sets itself: ``timeout=N``/``within=N`` and ``time.monotonic() + N``,
    but for those meant to run out. (``assert took < N`` is no wait: it is the bound the product
    promises, e.g. a lost node named within its timeout, and is not raised to make a test pass.)"""
    found = []
    skipped = _expected_to_run_out(function)
    for node in ast.walk(function):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.keyword) and node.arg in ("timeout", "within") \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, (int, float)):
            found.append(float(node.value.value))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.right, ast.Constant) \
                and isinstance(node.right.value, (int, float)) and "monotonic" in ast.unparse(node.left):
            found.append(float(node.right.value))
    return found


def too_close(records: list[dict], timeout: float, root: Path = Path(".")) -> list[str]:
    """Tests whose pytest-timeout or own waits are within MARGIN x of their wall time in this run."""
    functions: dict[tuple[str, str], ast.AST] = {}
    for path in {r["test"].partition("::")[0] for r in records}:  # each test file parsed once
        if (root / path).exists():
            for node in ast.walk(ast.parse((root / path).read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    functions.setdefault((path, node.name), node)
    said = []
    for r in records:
        path, _, rest = r["test"].partition("::")
        function = functions.get((path, re.split(r"[\[@]", rest)[0].split("::")[-1]))
        limits = ([timeout] if timeout else []) + (_waits(function) if function else [])
        wall = r.get("wall", 0.0)
        if limits and min(limits) < MARGIN * wall:
            said.append(f"{r['test']}: took {wall:.0f} s, a limit of {min(limits):.0f} s is within {MARGIN}x")
    return said


# ---- the per-file table -------------------------------------------------------------------

def _cpu(record: dict) -> float:
    """All a test started where the run could count it (a cgroup per test: root), else what it reaped."""
    value = record.get("cpu_all")
    return record.get("cpu", 0.0) if value is None else value


def per_file(records: list[dict]) -> dict[str, dict[str, float]]:
    files: dict[str, dict[str, float]] = defaultdict(lambda: {"tests": 0, "wall": 0.0, "cpu": 0.0, "busy": 0.0})
    for r in records:
        f = files[r["test"].split("::", 1)[0]]
        f["tests"] += 1
        f["wall"] += r.get("wall", 0.0)
        f["busy"] += r.get("busy", 0.0)
        f["cpu"] += _cpu(r)
    return files


def table(paths: list[str]) -> str:
    """Markdown: per test file, each run's wall time and the share of it its processes computed."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    tables = [per_file(run["tests"]) for run in runs]
    names = sorted(set().union(*tables), key=lambda n: -max(t.get(n, {}).get("wall", 0.0) for t in tables))
    head = ["file"] + [c for i in range(len(runs)) for c in
                       (f"tests{i + 1}", f"wall s{i + 1}", f"cpu s{i + 1}", f"cpu/wall{i + 1}", f"machine busy{i + 1}")]
    if len(runs) == 1:
        head = [h.rstrip("1") for h in head]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        cells = [name]
        for t, run in zip(tables, runs):
            f = t.get(name)
            if f is None:
                cells += ["", "", "", "", ""]
                continue
            wall = max(f["wall"], 1e-9)
            cells += [str(int(f["tests"])), f"{f['wall']:.0f}", f"{f['cpu']:.0f}", f"{f['cpu'] / wall:.0%}",
                      f"{f['busy'] / (wall * run['cpus']):.0%}"]
        lines.append("| " + " | ".join(cells) + " |")
    totals = ["**all**"]
    for t, run in zip(tables, runs):
        wall = sum(f["wall"] for f in t.values())
        cpu, busy = sum(f["cpu"] for f in t.values()), sum(f["busy"] for f in t.values())
        totals += [str(int(sum(f["tests"] for f in t.values()))), f"{wall:.0f} (in {run['elapsed']:.0f} elapsed)",
                   f"{cpu:.0f}", f"{cpu / max(wall, 1e-9):.0%}", f"{busy / max(wall * run['cpus'], 1e-9):.0%}"]
    lines.append("| " + " | ".join(totals) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Per test file: wall time, and how much of it was work (cpu: "
                                                 "all the test started, where a cgroup per test counted it (root), "
                                                 "else the processes it reaped; machine busy: every core)")
    parser.add_argument("paths", nargs="+", help="files written by pytest --timings-json")
    print(table(parser.parse_args(argv).paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
