"""``python -m parsl_torch.apps.watchdog TOKEN``: what a workflow leaves behind dies with it.

A workflow exports PARSL_TORCH_WORKFLOW=TOKEN before Parsl starts anything,
so Parsl's interchange, the local worker pools, the stages' supervisors and
their local ranks all carry it. This process waits on a pipe from the
workflow; when it closes (the workflow ended, however: even SIGKILL), it
kills every process on this host carrying the token. Stages on other nodes
stop themselves when the workflow's run-directory lock goes away (see
``launch.supervise``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ..common.entrypoints import WATCHDOG
from ..launch.supervise import reap

WORKFLOW_VAR = "PARSL_TORCH_WORKFLOW"


def start(token: str) -> subprocess.Popen:
    """The watchdog for the workflow ``token``; close its stdin to end it (then it reaps)."""
    env = {k: v for k, v in os.environ.items() if k != WORKFLOW_VAR}  # it must not carry the token
    return subprocess.Popen([sys.executable, "-m", WATCHDOG, token], stdin=subprocess.PIPE, env=env,
                            start_new_session=True)  # Ctrl-C in the terminal must not kill it first


def stop(watchdog: subprocess.Popen) -> None:
    """The workflow ends normally: the watchdog sweeps what is left and exits."""
    if watchdog.stdin:
        watchdog.stdin.close()
    try:
        watchdog.wait(timeout=30)
    except subprocess.TimeoutExpired:
        watchdog.kill()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: python -m {WATCHDOG} TOKEN (started by pt.workflow)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while sys.stdin.buffer.read(65536):
        pass
    # twice: a process killed in the first sweep may have started a child meanwhile
    for _ in range(2):
        reap(f"{WORKFLOW_VAR}={argv[0]}")
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
