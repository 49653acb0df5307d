"""Run a launch plan so that nothing hangs and nothing is left behind.

* A rank that fails reports to a socket this process listens on (see
  ``shim``); the launch then stops all ranks and exits with that rank's code
  within seconds. mpiexec alone would wait for the other ranks forever.
* ``timeout`` stops everything and exits 124; SIGINT/SIGTERM stop everything
  and exit 128+signal.
* Stopping: SIGTERM to the launcher (mpiexec/srun/torchrun tear down their
  ranks, remote ones included) and its process group, then SIGKILL after a
  grace period. Finally any local process that still carries this launch's
  token in its environment is killed: Hydra's proxies start their own
  sessions, so a process group alone does not reach the ranks.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..common.entrypoints import SUPERVISE
from ..core.topology import free_port
from .plan import LaunchPlan
from .shim import NOTIFY_VAR, describe_exit

GRACE_S = 10.0
TIMEOUT_EXIT = 124


def _say(message: str) -> None:
    print(f"parsl-torch: {message}", file=sys.stderr, flush=True)


class _FailureListener:
    """Accepts failure reports from the ranks' shims (one JSON line each) and
    puts them on ``events`` as ("report", dict)."""

    def __init__(self, events: queue.Queue) -> None:
        self.token = secrets.token_hex(12)
        self.server = socket.create_server(("", 0))
        self.address = f"{socket.gethostname()}:{self.server.getsockname()[1]}:{self.token}"
        self.events = events
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError, ValueError):
                conn.settimeout(5)
                report = json.loads(conn.makefile().readline())
                if report.pop("token", None) == self.token:
                    self.events.put(("report", report))

    def close(self) -> None:
        self.server.close()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def reap(token: str) -> int:
    """SIGKILL local processes whose environment carries ``token``; returns how many."""
    killed = 0
    needle = token.encode()
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
        except OSError:
            continue
    return killed


def _stop(proc: subprocess.Popen, grace: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        _signal_group(proc, sig)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _exit_code(code: int) -> int:
    return code if code >= 0 else 128 - code


def supervise(plan: LaunchPlan, timeout: float | None = None, grace: float = GRACE_S) -> int:
    """Run ``plan``; its exit code, or the failed rank's, 124 on timeout."""
    events: queue.Queue[tuple[str, object]] = queue.Queue()
    listener = _FailureListener(events)
    env = {**os.environ, **plan.env, NOTIFY_VAR: listener.address}
    received: list[int] = []
    handlers = {sig: signal.signal(sig, lambda s, _f: received.append(s))
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    proc = subprocess.Popen(plan.argv, env=env, start_new_session=True)
    threading.Thread(target=lambda: events.put(("exit", proc.wait())), daemon=True).start()
    deadline = time.monotonic() + timeout if timeout else None
    try:
        while True:
            try:  # wakes at once for a report or the launcher's exit; signals within 0.2 s
                kind, value = events.get(timeout=0.2)
            except queue.Empty:
                kind, value = "", None
            if kind == "report":
                _say(f"rank {value['rank']} on {value['host']} {describe_exit(value['code'])}; "
                     f"stopping the other {plan.num_ranks - 1} rank(s)")
                _stop(proc, grace)
                return _exit_code(value["code"])
            if kind == "exit":
                code = _exit_code(value)
                if code:  # name the rank if its report is on its way
                    with contextlib.suppress(queue.Empty):
                        kind, value = events.get(timeout=1.0)
                        if kind == "report":
                            _say(f"rank {value['rank']} on {value['host']} {describe_exit(value['code'])}")
                return code
            if received:
                _say(f"received {signal.Signals(received[0]).name}; stopping {plan.num_ranks} rank(s)")
                _stop(proc, grace)
                return 128 + received[0]
            if deadline and time.monotonic() > deadline:
                _say(f"timed out after {timeout:g} s; stopping {plan.num_ranks} rank(s)")
                _stop(proc, grace)
                return TIMEOUT_EXIT
    finally:
        if proc.poll() is None:
            _stop(proc, grace)
        reap(listener.token)
        listener.close()
        for sig, old in handlers.items():
            signal.signal(sig, old)


def main(argv: list[str] | None = None) -> int:
    """``python -m parsl_torch.launch.supervise [--timeout S] [--ranks N] -- LAUNCHER ARGV...``

    Supervises an already built launch command (a Parsl MPI task's
    ``$PARSL_MPI_PREFIX ...``): rendezvous on the first host of
    ``PARSL_MPI_NODELIST`` at a fresh port, fail fast, time out, leave nothing
    behind.
    """
    import argparse

    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog=f"python -m {SUPERVISE}")
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--ranks", type=int, default=0, help="for messages only")
    opts = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        parser.error("no command after --")
    # the rendezvous belongs to this task: values inherited from the workflow's
    # shell would make concurrent stages on one node share a port
    hosts = os.environ.get("PARSL_MPI_NODELIST", "").split(",")
    env = {"MASTER_ADDR": hosts[0] or "127.0.0.1", "MASTER_PORT": str(free_port())}
    plan = LaunchPlan(tuple(command), command[0], "parsl", None, 0, 0, opts.ranks or 0, (), env)
    return supervise(plan, timeout=opts.timeout)


if __name__ == "__main__":
    sys.exit(main())
