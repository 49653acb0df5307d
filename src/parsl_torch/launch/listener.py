"""The socket a launch listens on for its ranks: failure reports and each node's heartbeat
(see ``supervise``, which acts on the events, and ``shim``, which sends them)."""

from __future__ import annotations

import contextlib
import json
import queue
import resource
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Sequence

from ..errors import TopologyError
from .events import NodeSilent, RankReport, short

_MAX_LINE = 1 << 26  # (a rank's reads: one line of up to ~300,000 paths; folders of many files are one)
#: seconds a connection may stay open before its first bytes show the token (a stranger's is closed)
AUTH_S = 10.0


LOCAL_NAMES = ("", "localhost", "127.0.0.1")


def listen_address(nodes: Sequence[str]) -> tuple[str, str]:
    """(name the ranks connect to, address to bind) for the ranks' reports: loopback when every
    rank runs on this host; else this host's name and the address it resolves to (the one the
    other nodes reach it by); every interface only if that name resolves to loopback here."""
    here = socket.gethostname()
    if all(node in (*LOCAL_NAMES, here, short(here)) for node in nodes):
        return "127.0.0.1", "127.0.0.1"
    try:
        address = socket.gethostbyname(here)
    except OSError:
        return here, ""
    return here, "" if address.startswith("127.") else address


#: seconds between two looks for silent nodes (a heartbeat's arrival does not trigger one: at thousands
#: of nodes a look per heartbeat would cost nodes x heartbeats per second)
SCAN_S = 0.5
#: open files the supervisor needs besides one connection per node (reports, reads, its own files)
SPARE_FDS = 256


def open_files_for(nodes: int) -> int:
    """Let this process keep one connection per node: the soft limit of open files raised to the hard
    one; a TopologyError naming both limits and the fixes where even the hard one is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = nodes + SPARE_FDS
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise TopologyError(
            f"a launch on {nodes} nodes keeps one connection per node open in its supervisor and needs about "
            f"{needed} open files, but this process may open at most {hard} (the hard limit, ulimit -Hn): have "
            f"the limit raised (/etc/security/limits.conf, or the batch system's), or run the stage on fewer nodes")
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard) and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return needed


def short_queue(nodes: int, path: str = "/proc/sys/net/core/somaxconn") -> str | None:
    """A warning where the kernel caps the listen queue below the nodes' hellos (it cuts every backlog to
    net.core.somaxconn): hellos past it wait for TCP's retries, seconds each."""
    try:
        cap = int(open(path).read())
    except (OSError, ValueError):
        return None
    if cap >= nodes:
        return None
    return (f"the kernel caps a listen queue at {cap} connections (net.core.somaxconn), fewer than this launch's "
            f"{nodes} nodes: when their hellos come at once some wait for TCP's retry (1 s, then 3 s); an "
            f"administrator can raise it (sysctl -w net.core.somaxconn={max(4096, nodes)})")


def _silent(kind: str, node: dict, silent_s: float = 0.0) -> NodeSilent:
    ranks = tuple(r for r in node.get("ranks", ()) if isinstance(r, int))
    return NodeSilent(kind, str(node["host"]), ranks, silent_s)


class RankListener:
    """The ranks' shims talk to this one socket (JSON lines, each starting with the token:
    ``{"token": "..."``; a connection whose first bytes are anything else is closed as they come, and
    one that shows nothing for ``AUTH_S`` seconds too, so a stranger on the node can neither change a
    record nor make this process hold what it sends):

    * a failure report (one line on its own connection): a ``RankReport``;
    * a rank's reads (one line on its own connection, closed here once taken: ``observe.recorder``);
    * a node's heartbeat: local rank 0's shim says hello (host, its node's
      ranks), then a newline every few seconds, and "bye" when it ends. EOF
      without bye: a ``NodeSilent`` "vanished"; silence for ``node_timeout``
      seconds: "lost" - a powered-off node or a cut link sends nothing at all,
      so only silence shows it, long before the collective timeout.

    (``events``: the events' types.)

    One thread with ``selectors``: a node costs one connection, not a thread; every connection
    waiting is taken at each wake, and silent nodes are looked for every SCAN_S, so the cost per
    second grows with the nodes, not with their square.
    """

    def __init__(self, events: queue.Queue, node_timeout: float, nodes: Sequence[str] = ()) -> None:
        self.token = secrets.token_hex(12)
        host, bind = listen_address(nodes)
        open_files_for(len(nodes))
        # the queue holds a storm of hellos (every node at once): none waits for TCP's retry (1 s, 3 s)
        self.server = socket.create_server((bind, 0), backlog=max(socket.SOMAXCONN, len(nodes) + SPARE_FDS))
        self.server.setblocking(False)
        self.address = f"{host}:{self.server.getsockname()[1]}:{self.token}"
        self._prefix = json.dumps({"token": self.token})[:-1].encode()  # what every message of a shim starts with
        self._strangers: dict[socket.socket, float] = {}  # connections whose token has not shown yet: since when
        self.events, self.node_timeout = events, node_timeout
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.server, selectors.EVENT_READ)
        self._closed = False
        self.greeted: set[str] = set()  # short names of the nodes that said hello
        self.waiting: set[str] = set()  # short names of the spares whose ranks wait (``rejoin``)
        self.byes: dict[str, int | None] = {}  # short names of the nodes whose first shim said bye: its rank's exit
        self.reads: set[str] = set()  # what the ranks' Python processes read (``observe.recorder``), merged
        self.read_ranks: set[int] = set()  # the ranks that sent theirs
        self.stopped: dict[int, tuple[str, float]] = {}  # rank -> (host, since when): stopped by a signal
        self._nodes: dict[socket.socket, dict] = {}  # heartbeat connections: node info + last_seen
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        buffers: dict[socket.socket, bytearray] = {}
        nodes = self._nodes
        next_scan = time.monotonic() + SCAN_S
        while not self._closed:
            try:
                ready = self.selector.select(timeout=0.5)
            except (OSError, ValueError):
                return
            now = time.monotonic()
            for key, _ in ready:
                if key.fileobj is self.server:
                    self._accept_all(buffers)
                else:
                    self._receive(key.fileobj, buffers, nodes, now)
            if now >= next_scan:
                next_scan = now + SCAN_S
                for sock in [s for s, since in self._strangers.items() if now - since > AUTH_S]:
                    self._drop(sock, buffers)
                for sock, node in list(nodes.items()):
                    if now - node["seen"] > self.node_timeout:
                        nodes.pop(sock)  # (named for the timeout it passed: the look comes up to SCAN_S later)
                        self.events.put(_silent("lost", node, self.node_timeout))
                        self._drop(sock, buffers)

    def send(self, host: str, line: bytes) -> bool:
        """``line`` to node ``host``'s first shim (a rejoin); False where it is not connected."""
        for sock, node in list(self._nodes.items()):
            if short(node["host"]) == short(host):
                try:  # (a few hundred bytes: an idle connection's buffer takes them at once)
                    return sock.send(line) == len(line)
                except OSError:
                    return False
        return False

    def adopt(self, spare: str, ranks: Sequence[int]) -> None:
        """A waiting spare now holds a lost node's ``ranks``: named with them if it is lost in its turn."""
        for node in list(self._nodes.values()):
            if short(node["host"]) == short(spare):
                node["ranks"] = list(ranks)
        self.waiting.discard(short(spare))
        self.greeted.add(short(spare))

    def connected(self) -> int:
        """How many nodes' shims are connected now (a node's connection ends with its last rank there)."""
        return len(self._nodes)

    def _receive(self, sock: socket.socket, buffers: dict, nodes: dict, now: float) -> None:
        """What a connection sent: its complete lines taken; its end, a stranger's bytes or a line longer
        than any shim's closes it (a node's heartbeat connection that ends without bye: "vanished")."""
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            node = nodes.pop(sock, None)
            if node is not None and not node.get("bye"):
                self.events.put(_silent("vanished", node))
            self._drop(sock, buffers)
            return
        buffers[sock] += data
        if (sock in self._strangers and not self._shows_token(sock, buffers[sock])) or len(buffers[sock]) > _MAX_LINE:
            nodes.pop(sock, None)
            self._drop(sock, buffers)
            return
        if sock in nodes:
            nodes[sock]["seen"] = now
        while b"\n" in buffers.get(sock, b""):
            line, _, rest = bytes(buffers[sock]).partition(b"\n")
            buffers[sock] = bytearray(rest)
            self._line(sock, line, nodes, buffers, now)

    def _accept_all(self, buffers: dict) -> None:
        """Every connection waiting in the queue (a storm of hellos is taken in one wake)."""
        while True:
            try:
                conn, _ = self.server.accept()
            except BlockingIOError:
                return
            except OSError:  # (out of file descriptors: the queue keeps them until some close)
                time.sleep(0.01)
                return
            conn.setblocking(False)
            buffers[conn] = bytearray()
            self._strangers[conn] = time.monotonic()
            self.selector.register(conn, selectors.EVENT_READ)

    def _line(self, sock: socket.socket, line: bytes, nodes: dict, buffers: dict, now: float) -> None:
        if not line.strip():
            return  # a heartbeat
        try:
            message = json.loads(line)
        except ValueError:
            message = {}
        if not isinstance(message, dict) or message.pop("token", None) != self.token:
            self._drop(sock, buffers)
            return
        if message.get("hello"):
            nodes[sock] = {"host": message.get("host", "?"), "ranks": message.get("ranks", []), "seen": now}
            (self.waiting if message.get("standby") else self.greeted).add(short(nodes[sock]["host"]))
        elif message.get("bye"):
            if sock in nodes:
                nodes[sock]["bye"] = True
                code = message.get("code")
                self.byes[short(nodes[sock]["host"])] = code if isinstance(code, int) else None
        elif isinstance(message.get("stopped"), (int, float)):  # (no event: its peers' failure follows)
            self.stopped[int(message.get("rank", -1))] = (str(message.get("host", "?")), float(message["stopped"]))
            self._drop(sock, buffers)
        elif isinstance(message.get("reads"), list):
            self.reads.update(str(line) for line in message["reads"])
            self.read_ranks.add(int(message.get("rank", -1)))
            self._drop(sock, buffers)  # (the shim waits for this: its reads are here before it exits)
        else:
            self.events.put(RankReport.of(message))

    def _shows_token(self, sock: socket.socket, buffer: bytearray) -> bool:
        """Whether a connection's first bytes are (so far) the token's: once they all are, it is a shim's."""
        head = bytes(buffer[:len(self._prefix)])
        if not self._prefix.startswith(head):
            return False
        if len(head) == len(self._prefix):
            del self._strangers[sock]
        return True

    def _drop(self, sock: socket.socket, buffers: dict) -> None:
        buffers.pop(sock, None)
        self._strangers.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.selector.unregister(sock)
        sock.close()

    def close(self) -> None:
        self._closed = True
        self.server.close()
