"""``python -m parsl_torch.apps.session.watchdog TOKEN``: what a workflow leaves behind dies with it.

A workflow exports settings.WORKFLOW (a token) before Parsl starts anything,
so Parsl's interchange, the local worker pools, the stages' supervisors and
their local ranks all carry it from their first instant (with settings.KEEP_ENVIRON,
Parsl's setproctitle leaves it in the environment of the processes it renames).
This process waits on a pipe from the workflow, also noting every second the
workflow's descendants that Parsl renamed (for a setproctitle that overwrites
the environment regardless). When the pipe closes (the
workflow ended, however: even SIGKILL), it kills the descendants it noted
(if still the same processes) and every process on this host carrying the
token; after a normal end (the workflow says so before closing the pipe),
the workflow process's own direct children are spared (Parsl has ended its pools by then; what is left there is the
caller's, e.g. multiprocessing's resource tracker). Stages on other nodes
stop themselves when the workflow's run-directory lock goes away (see
``launch.supervise``).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time

from ...common import settings
from ...common.entrypoints import WATCHDOG
from ...common.procs import proc_stat
from ...common.procs import reap


def start(token: str) -> subprocess.Popen:
    """The watchdog for this workflow (``token``); close its stdin to end it (then it reaps)."""
    env = {k: v for k, v in os.environ.items() if k != settings.WORKFLOW.name}  # it must not carry the token
    return subprocess.Popen([sys.executable, "-m", WATCHDOG, token, str(os.getpid())], stdin=subprocess.PIPE,
                            env=env, start_new_session=True)  # Ctrl-C in the terminal must not kill it first


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every process."""
    stats = {int(e.name): proc_stat(e.name) for e in os.scandir("/proc") if e.name.isdigit()}
    return {pid: (s.ppid, s.start) for pid, s in stats.items() if s is not None}


def _renamed_by_parsl(pid: int) -> bool:
    """Parsl's processes that set their title ("parsl: HTEX interchange"): only these are noted,
    never the workflow process's other children (a notebook's, a test runner's)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().startswith(b"parsl: ")
    except OSError:
        return False


def _running(pid: int, start: str) -> bool:
    """``pid`` is still the process that started at ``start``, and not a zombie."""
    stat = proc_stat(pid)
    return stat is not None and stat.start == start and stat.state != "Z"


def descendants(root: int, table: dict[int, tuple[int, str]]) -> dict[int, str]:
    """pid -> start time of every process below ``root``."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = table[pid][1]
        todo.extend(children.get(pid, []))
    return found


#: what the workflow writes before closing the pipe when it ends normally
NORMAL_END = b"end\n"


def stop(watchdog: subprocess.Popen) -> None:
    """The workflow ends normally: the watchdog sweeps what is left and exits."""
    if watchdog.stdin:
        with contextlib.suppress(OSError):
            watchdog.stdin.write(NORMAL_END)
            watchdog.stdin.flush()
        watchdog.stdin.close()
    try:
        watchdog.wait(timeout=30)
    except subprocess.TimeoutExpired:
        watchdog.kill()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or not argv[1].isdigit():
        print(f"usage: python -m {WATCHDOG} TOKEN WORKFLOW_PID (started by pt.workflow)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    workflow = int(argv[1])
    workflow_start = _processes().get(workflow, (0, ""))[1]
    noted: dict[int, str] = {}
    said = b""
    while True:
        if select.select([sys.stdin], [], [], 1.0)[0]:
            data = os.read(sys.stdin.fileno(), 65536)
            if not data:
                break  # the workflow ended, however
            said = (said + data)[-len(NORMAL_END):]
        table = _processes()
        found = {pid: start for pid, start in descendants(workflow, table).items() if _renamed_by_parsl(pid)}
        noted = {pid: start for pid, start in {**noted, **found}.items()
                 if pid in table and table[pid][1] == start}  # forget the ended ones
    spare: frozenset[int] = frozenset()
    # a normal end says so before closing the pipe; a killed workflow only closes it (and may
    # still look alive for a moment while the kernel tears it down: its state alone is a race)
    if said == NORMAL_END and _running(workflow, workflow_start):
        # the workflow ended its block normally: what it still runs itself (a multiprocessing
        # resource tracker started inside the block, a notebook's helpers) is its own to end
        noted = {}
        spare = frozenset(pid for pid, (ppid, _) in _processes().items() if ppid == workflow)
    # again after a sweep that killed something: it may have started a child meanwhile. A sweep that
    # finds nothing (a normal end: Parsl ended its processes) ends it at once, the workflow waits for it
    token = f"{settings.WORKFLOW.name}={argv[0]}"
    if _sweep(noted, token, spare):
        time.sleep(0.5)
        _sweep(noted, token, spare)
    return 0


def _sweep(noted: dict[int, str], token: str, spare: frozenset[int]) -> int:
    """SIGKILL the noted processes still running and those carrying ``token``; how many."""
    killed = 0
    table = _processes()
    for pid, start in noted.items():
        if pid in table and table[pid][1] == start and pid != os.getpid():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed + reap(token, spare)


if __name__ == "__main__":
    sys.exit(main())
