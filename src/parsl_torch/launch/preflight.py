"""Before a multi-node stage starts (site ``mpi.preflight: SECONDS``): every node answers.

The supervisor launches, through the stage's own launcher and on the stage's nodes, one tiny
process per rank (``python -m parsl_torch.launch.preflight``): it starts the stage's Python,
finds torch without importing it, and connects back to the supervisor (the network from each
node to the block's first). A node none of whose processes answers within SECONDS is named
and quarantined (``launch.quarantine``), and the stage is handed back to the block's pool, which
places it on other nodes (or on the nodes left, with ``min_nodes``). When no node answers,
nothing is blamed on a node: the launch itself then shows what is wrong.

The same check confirms a node loss before the node is quarantined (``supervise``): a node whose
ranks' processes ended without a word but that answers was not lost (the program killed its own
processes, an out-of-memory killer ended them); it stays in service.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from ..common import settings
from ..common.entrypoints import PREFLIGHT, SHIM, shim_at
from ..common.procs import reap, stop
from .events import RankReport, short
from .listener import RankListener
from .plan import LaunchPlan


def check_argv(argv: Sequence[str]) -> list[str]:
    """The stage's launch command with the ranks' program replaced by the check."""
    if (i := shim_at(argv)) < 0:
        raise ValueError(f"no '-m {SHIM}' in the launch command: {' '.join(argv)}")
    return [*argv[:i + 1], PREFLIGHT]


def answering(plan: LaunchPlan, seconds: float) -> tuple[set[str], str]:
    """The short names of ``plan.nodes`` whose check answered within ``seconds``, and the last line the
    launcher printed."""
    events: queue.Queue = queue.Queue()
    listener = RankListener(events, seconds, plan.nodes)
    expected = {short(n) for n in plan.nodes}
    answered: set[str] = set()
    env = {**os.environ, **plan.env, settings.LAUNCH_NOTIFY.name: listener.address}
    deadline = time.monotonic() + seconds
    with tempfile.TemporaryFile("w+") as said:
        proc = subprocess.Popen(check_argv(plan.argv), env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=said)
        try:
            exited = None
            while answered < expected and (left := deadline - time.monotonic()) > 0:
                if proc.poll() is not None:  # answers sent just before may still be on their way
                    exited = exited or time.monotonic()
                    if time.monotonic() - exited > 1.0:
                        break
                try:
                    event = events.get(timeout=min(left, 0.2))
                except queue.Empty:
                    continue
                if isinstance(event, RankReport) and event.preflight:
                    answered.add(short(event.host))
        finally:
            stop(proc, 2.0)  # SIGTERM first: the launcher then stops its processes on the other nodes
            reap(listener.token)
            listener.close()
        while not events.empty():  # answers that came with the launcher's exit
            event = events.get()
            if isinstance(event, RankReport) and event.preflight:
                answered.add(short(event.host))
        said.seek(0)
        last = said.read().strip().splitlines()[-1:]
    return answered, last[0][:200] if last else ""


def silent_nodes(plan: LaunchPlan, seconds: float) -> dict[str, str]:
    """Host -> why, for each of ``plan.nodes`` whose check did not answer within ``seconds``; empty
    when every node answered, or when none did (then no node is to blame)."""
    answered, last = answering(plan, seconds)
    if not answered:
        return {}
    why = (f"did not answer the pre-flight check within {seconds:g} s (the launcher could not start Python "
           f"there, its Python environment did not load, or it cannot reach {socket.gethostname()})")
    expected = {short(n) for n in plan.nodes}
    return {host: why + (f"; the launcher said: {last}" if last else "") for host in sorted(expected - answered)}


def main() -> int:
    """A rank of the check: Python starts, torch is there, the supervisor is reachable."""
    address = settings.LAUNCH_NOTIFY.get()
    if not address or importlib.util.find_spec("torch") is None:
        return 1
    host, port, token = address.rsplit(":", 2)
    message = {"token": token, "preflight": True, "host": socket.gethostname(), "pid": os.getpid()}
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall((json.dumps(message) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
