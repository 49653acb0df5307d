"""PID 1 of a test-cluster node (TEST HARNESS, see cluster.py).

Runs inside the node's fresh namespaces (network, UTS, PID, mount): sets the
hostname, bind-mounts the node's /etc/hosts, an empty /etc/resolv.conf and its
own storage (cluster.NODE_LOCAL), mounts its own /dev/shm (its memory),
waits until the host side has plugged its network in, starts the node's
daemons (the exec daemon that stands in for sshd/PALS, and slurmd when the
cluster has Slurm), then reaps orphans forever. As PID 1 it ignores SIGTERM;
SIGKILL from the host ends the node and everything in it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    node_dir = Path(spec["node_dir"])
    socket.sethostname(spec["name"])
    mounts = [(node_dir / "hosts", "/etc/hosts"), (node_dir / "resolv.conf", "/etc/resolv.conf")]
    if spec.get("node_local"):  # the node's own storage
        mounts.append(tuple(spec["node_local"]))
    for src, dst in mounts:
        subprocess.run(["mount", "--bind", str(src), str(dst)], check=True)
    # the node's own memory file system: what a node keeps in /dev/shm is lost with it, as on a real node
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g,mode=1777", "tmpfs", "/dev/shm"], check=True)
    go = node_dir / "network-ready"
    while not go.exists():
        time.sleep(0.02)
    log = open(node_dir / "daemons.log", "ab", buffering=0)
    env = {"PATH": spec["path"], "HOME": "/root", "LANG": "C.UTF-8"}
    for argv in spec["daemons"]:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True)
    (node_dir / "up").write_text("")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:  # PID 1: every orphan of the node ends up here
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.5)


if __name__ == "__main__":
    main()
