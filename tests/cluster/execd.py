#!/usr/bin/env python3
"""The test cluster's stand-in for sshd and ssh (TEST HARNESS, see cluster.py).

``execd.py serve PORT`` runs in every node (started by node_init.py): it runs
commands sent over TCP on the private bridge and streams their output back.
``nsexec HOST [ssh options] COMMAND...`` (this file, via bin/nsexec) is the
client with ssh's calling convention, so MPICH's hydra uses it as
``HYDRA_LAUNCHER=ssh HYDRA_LAUNCHER_EXEC=.../nsexec``, the way PALS's daemons
start ranks on Aurora and Polaris. As with ssh, the command's processes are
signalled when the client goes away. Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
from pathlib import Path

PORT = 7022
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_FRAME = struct.Struct("!ci")  # kind (O stdout, E stderr, X exit), length or exit code


def _send(sock: socket.socket, lock: threading.Lock, kind: bytes, data: bytes = b"", code: int = 0) -> None:
    with lock:
        sock.sendall(_FRAME.pack(kind, len(data) if kind != b"X" else code) + data)


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        line = self.rfile.readline()
        if not line.strip():
            return  # a readiness probe
        request = json.loads(line)
        env = {"PATH": LOGIN_PATH, "HOME": "/root", "LANG": "C.UTF-8", **request.get("env", {})}
        try:
            proc = subprocess.Popen(request["argv"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=env, cwd=request.get("cwd") or "/",
                                    start_new_session=True)
        except OSError as exc:
            lock = threading.Lock()
            _send(self.request, lock, b"E", f"execd: {exc}\n".encode())
            _send(self.request, lock, b"X", code=127)
            return
        lock = threading.Lock()

        def pump(stream, kind: bytes) -> None:
            for chunk in iter(lambda: stream.read1(65536), b""):
                try:
                    _send(self.request, lock, kind, chunk)
                except OSError:
                    pass

        pumps = [threading.Thread(target=pump, args=(s, k), daemon=True)
                 for s, k in ((proc.stdout, b"O"), (proc.stderr, b"E"))]
        for t in pumps:
            t.start()

        def hang_up() -> None:  # like sshd: the client went away, so the command goes too
            try:
                while self.request.recv(1):
                    pass
            except OSError:
                pass
            if proc.poll() is None:
                for sig in (signal.SIGHUP, signal.SIGTERM):
                    try:
                        os.killpg(proc.pid, sig)
                    except OSError:
                        pass
                try:
                    proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except OSError:
                        pass

        threading.Thread(target=hang_up, daemon=True).start()
        code = proc.wait()
        for t in pumps:
            t.join(timeout=5)
        try:
            _send(self.request, lock, b"X", code=code)
        except OSError:
            pass


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(port: int) -> None:
    with _Server(("0.0.0.0", port), _Handler) as server:
        server.serve_forever()


def resolve(host: str) -> str:
    """A node's bridge address from the cluster's hosts file (the host side has no entry)."""
    hosts = Path(os.environ.get("PT_CLUSTER_DIR", "/tmp/pt-cluster")) / "hosts"
    if hosts.exists():
        for line in hosts.read_text().splitlines():
            fields = line.split()
            if len(fields) > 1 and host in fields[1:]:
                return fields[0]
    return host


def run(host: str, argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None,
        stdout=None, stderr=None, connect_timeout: float = 10.0) -> int:
    """Run ``argv`` on node ``host``; its exit code (128+N if killed by signal N, 255 if unreachable)."""
    out = stdout or sys.stdout.buffer
    err = stderr or sys.stderr.buffer
    try:
        sock = socket.create_connection((resolve(host), PORT), timeout=connect_timeout)
    except OSError as exc:
        err.write(f"nsexec: {host}: cannot connect: {exc}\n".encode())
        err.flush()
        return 255
    sock.settimeout(None)
    with sock:
        sock.sendall((json.dumps({"argv": argv, "env": env or {}, "cwd": cwd}) + "\n").encode())
        reader = sock.makefile("rb")
        while True:
            head = reader.read(_FRAME.size)
            if len(head) < _FRAME.size:
                err.write(f"nsexec: {host}: connection lost\n".encode())
                err.flush()
                return 255
            kind, value = _FRAME.unpack(head)
            if kind == b"X":
                return value if value >= 0 else 128 - value
            target = out if kind == b"O" else err
            target.write(reader.read(value))
            target.flush()


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        serve(int(argv[1]) if len(argv) > 1 else PORT)
        return 0
    # ssh's calling convention: options, HOST, then words joined into one shell command
    args = list(argv)
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        if opt in ("-o", "-p", "-l", "-i", "-F") and args:
            args.pop(0)
    if len(args) < 2:
        print("usage: nsexec [ssh options] HOST COMMAND...", file=sys.stderr)
        return 2
    host, command = args[0], " ".join(args[1:])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return run(host, ["/bin/sh", "-c", command], cwd=os.environ.get("HOME", "/root"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
