"""``python -m parsl_torch.launch.shim -- CMD ...`` (or ``--argv-file FILE``): what every launched rank runs.

It exports the torchrun variables (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) from whatever launcher
started it (and OMP_NUM_THREADS=1 with several ranks per node, as torchrun), so an unmodified torchrun-style script runs under mpiexec or srun,
then runs CMD as its child, forwarding signals. When CMD fails it tells
``parsl-torch launch`` which rank failed (settings.LAUNCH_NOTIFY), and the
exception that ended it when CMD says so (settings.RAISED, ``common.raised``), so the
launch stops every rank within seconds and names the cause; the first shim on each node also
sends the launch a heartbeat, so a lost node is named (see ``supervise``).
At settings.DEADLINE (the block is about to end) it sends CMD SIGUSR1 if CMD
catches that signal (``pt.should_checkpoint()`` does; a script that does not is left alone).
It never initialises MPI; the command may where PMI is found by name (PMIx: PALS, Slurm's pmix), not
where it is an inherited socket (``PMI_FD``: hydra's mpiexec, Slurm's pmi2), which stays the shim's: a
rank it orphaned would keep a killed shim's launch up. For those, the shim says PMI's goodbye when the
command ended well (``common.pmi``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict

from ..observe import native as preload
from ..common import settings
from ..common.blocks import deadline_from_env
from ..common.entrypoints import SHIM
from ..common.pmi import finish_pmi
from ..observe.recorder import boot_folder, observed_any, reads_of, skipped_places, temp_folders
from ..common.raised import read_raised
from ..core.topology import Topology, resolve_master, topology_from_env
from . import rejoin
from .cpushare import pin
from .events import RankReport

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
HEARTBEAT_S = 2.0
#: seconds a node's hello may take to connect (the listener's queue holds a whole storm of hellos:
#: ``listener``; an unreachable one leaves the node unwatched rather than hold up its ranks)
CONNECT_S = 5.0
#: seconds a rank stays stopped (SIGSTOP, SIGTSTP) before its shim tells the launch: its peers' collectives
#: then time out, and the stage's error names the stopped rank, not the one that waited for it
STOPPED_S = 2.0


def torchrun_env(env: Mapping[str, str]) -> tuple[Topology, dict[str, str]]:
    """The torchrun variables, which launcher's variables they came from (so the rank's log names
    mpiexec's or srun's, not torchrun), and OMP_NUM_THREADS=1 with several ranks per node unless
    set (as torchrun does: every rank's OpenMP pool would otherwise take every core)."""
    topo = resolve_master(topology_from_env(env), env, use_mpi=False)
    extra = {
        "RANK": str(topo.rank), "LOCAL_RANK": str(topo.local_rank),
        "WORLD_SIZE": str(topo.world_size), "LOCAL_WORLD_SIZE": str(topo.local_world_size),
        "GROUP_RANK": str(topo.rank // topo.local_world_size),
        "MASTER_ADDR": str(topo.master_addr), "MASTER_PORT": str(topo.master_port),
        settings.SHIM_SOURCE.name: f"{topo.rank_source}:{topo.rank}:{topo.world_size}",
    }
    if "OMP_NUM_THREADS" not in env and topo.local_world_size > 1:
        extra["OMP_NUM_THREADS"] = "1"
    return topo, extra


def send_reads(address: str, rank: int, reads: set[str]) -> bool:
    """What the rank's Python processes read, to the supervisor, which answers by closing the
    connection once it has them (so they are there before the launcher's exit); False if it cannot
    be reached."""
    return notify(address, {"reads": sorted(reads), "rank": rank}, timeout=30, answered=True)


def _observing(address: str | None) -> str | None:
    """The rank's node-local folder for what its processes read (None: not observed: no stage, or no folder)."""
    if not (address and settings.OBSERVE.get()):
        return None
    try:
        return tempfile.mkdtemp(prefix="parsl-torch-reads-")
    except OSError:
        return None


def observing_env(folder: str, environ: Mapping[str, str], cmd: list[str]) -> dict[str, str]:
    """What a rank's environment gets so that every process in it is observed into ``folder``: Python's
    through its ``sitecustomize``, every process's through the preloaded library (``observe.native``). What
    ``cmd`` reads unseen (a static program; a program where the library could not be built) is said in
    the folder, so that the stage makes no skip promise (a Python is its own observer's to judge: not read
    here at every rank's start)."""
    path = environ.get("PYTHONPATH")
    boot = boot_folder(folder)
    extra = {settings.READS_DIR.name: folder, "PYTHONPATH": boot + (os.pathsep + path if path else "")}
    library = preload.library()
    if library is not None:
        extra.update(preload.preload_env(library, environ, skipped_places(), temp_folders(environ), time.time()))
    program = shutil.which(cmd[0], path=environ.get("PATH")) or cmd[0]
    python = preload.python_program(program)
    why = None if python else \
        preload.unobservable(program) if library is not None else f"{preload.why_not()}: {program}"
    said = ([] if python else ["e *"]) + ([f"x {why}"] if why else [])  # (a program reads its whole environment)
    if said:
        with open(os.path.join(folder, "shim.txt"), "w") as f:
            f.write("".join(f"{line}\n" for line in said))
    return extra


def _report_reads(address: str, rank: int, folder: str) -> None:
    """The rank's reads to the supervisor; nothing where its Python was not observed (the supervisor then
    knows that not every rank told, and the stage's skip does not lean on its reads)."""
    try:
        reads = reads_of(folder) if observed_any(folder) else None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if reads is not None:
        send_reads(address, rank, reads)


def notify(address: str, report: dict, timeout: float = 5, answered: bool = False) -> bool:
    """Send one JSON line to the launcher (``answered``: then wait until it closes the connection); False if it
    cannot be reached."""
    host, port, token = address.rsplit(":", 2)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            s.sendall((json.dumps({"token": token, **report}) + "\n").encode())  # (the token first: listener)
            if answered:
                s.shutdown(socket.SHUT_WR)
                while s.recv(4096):
                    pass
        return True
    except OSError:
        return False


def hello_line(token: str, host: str, first: int, ranks: int, standby: bool = False) -> bytes:
    """A node's hello: its host and its ranks (first, last), or that its ranks wait as a spare's; a heartbeat
    is then a bare newline."""
    said = {"token": token, "hello": True, "host": host, "ranks": [first, first + ranks - 1]}
    return (json.dumps({**said, "standby": True} if standby else said) + "\n").encode()


def bye_line(token: str, code: int | None = None) -> bytes:
    """A node's goodbye, with its first rank's exit code (after a rejoin the launch ends on the byes)."""
    return (json.dumps({"token": token, "bye": True, "code": code}) + "\n").encode()


class Heartbeat:
    """Local rank 0's line to the launch: hello (host, this node's ranks), a
    newline every HEARTBEAT_S, bye at the end. A node that cannot reach the
    launch is simply not watched. What the launch says back (a rejoin: ``rejoin``)
    is left for the node's ranks."""

    def __init__(self, address: str, topo: Topology) -> None:
        host, port, token = address.rsplit(":", 2)
        self._stop = threading.Event()
        try:
            self._sock = socket.create_connection((host, int(port)), timeout=CONNECT_S)
            self._sock.sendall(hello_line(token, topo.hostname, topo.rank - topo.local_rank, topo.local_world_size,
                                          standby=settings.STANDBY.get()))
        except OSError:
            self._sock = None
            return
        self._token = token
        threading.Thread(target=self._beat, daemon=True).start()
        threading.Thread(target=self._hear, daemon=True).start()

    def _hear(self) -> None:
        said = b""
        while not self._stop.is_set():
            try:
                data = self._sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            said += data
            while b"\n" in said:
                line, _, said = said.partition(b"\n")
                rejoin.take(line, self._token)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._sock.sendall(b"\n")
            except OSError:
                return

    def close(self, code: int | None = None) -> None:
        self._stop.set()
        if self._sock is not None:
            try:
                self._sock.sendall(bye_line(self._token, code))
            except OSError:
                pass
            self._sock.close()
            rejoin.forget(self._token)


def watch_stopped(child: subprocess.Popen, address: str, topo: Topology) -> None:
    """Tell the launch once if the rank is stopped (its state ``T`` in /proc) for STOPPED_S."""

    def state(pid: int) -> str:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    def a_fork_stopped() -> bool:  # (the training a kept rank's parent forked: ``apps.stage.kept``)
        try:
            with open(f"/proc/{child.pid}/task/{child.pid}/children") as f:
                forks = [int(pid) for pid in f.read().split()]
        except (OSError, ValueError):
            return False
        for pid in forks:
            with contextlib.suppress(OSError, IndexError):
                if state(pid) == "T":
                    return True
        return False

    def watch() -> None:
        since = None
        while child.poll() is None:
            try:
                stopped = state(child.pid) == "T" or a_fork_stopped()
            except (OSError, IndexError):
                return
            since = (since or time.time()) if stopped else None
            if since is not None and time.time() - since >= STOPPED_S:
                notify(address, {"stopped": since, "rank": topo.rank, "host": topo.hostname})
                return
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()


def catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (Linux: /proc/PID/status SigCgt)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next((line.split()[1] for line in f if line.startswith("SigCgt:")), "0")
    except (OSError, IndexError):
        return False
    return bool(int(mask, 16) >> (sig - 1) & 1)


def signal_at_deadline(child: subprocess.Popen, deadline: float) -> None:
    """A thread that sends ``child`` SIGUSR1 at ``deadline`` (epoch seconds) if it catches it."""

    def wait_and_signal() -> None:
        time.sleep(max(0.0, deadline - time.time()))
        if child.poll() is None and catches(child.pid, signal.SIGUSR1):
            child.send_signal(signal.SIGUSR1)

    threading.Thread(target=wait_and_signal, daemon=True).start()


def _command(argv: list[str]) -> list[str]:
    """``-- CMD ...``, or ``--argv-file F``: CMD as a JSON list in a private file, so that what it
    carries (a script's --api-key) stays off the launcher's and this process's command lines."""
    if argv[:1] == ["--argv-file"] and len(argv) == 2:
        with open(argv[1]) as f:
            cmd = json.load(f)
        return [str(word) for word in cmd] if isinstance(cmd, list) else []
    return argv[1:] if argv[:1] == ["--"] else argv


def _rank_now(topo: Topology, address: str | None) -> int:
    """The rank's number now: a spare's waiting rank took a lost node's (``rejoin``)."""
    word = rejoin.read(token) if settings.STANDBY.get() and (token := rejoin.token_of(address)) else None
    env = word.rank_env(topo.hostname, topo.local_rank, topo.local_world_size) if word else None
    return int(env["RANK"]) if env else topo.rank


def _raised_file() -> str | None:
    """An empty private file (0600) for the rank's exception (``common.raised``); None where none can be made.
    Where /proc names this process's open files, it is removed at once and the rank (or any process under it)
    opens it as ``/proc/<this pid>/fd/<fd>``: nothing is left in the node's /tmp however this process ends (a
    launcher's SIGKILL of every rank of a failed job included); elsewhere it is removed once read."""
    try:
        fd, path = tempfile.mkstemp(prefix="parsl-torch-raised-")
    except OSError:
        return None
    held = f"/proc/{os.getpid()}/fd/{fd}"  # (kept open for this process's life)
    if os.path.exists(held):
        os.unlink(path)
        return held
    os.close(fd)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmd = _command(argv)
    if not cmd or argv[:1] in (["-h"], ["--help"]):
        print(f"usage: python -m {SHIM} -- COMMAND [ARGS...] | --argv-file FILE (a JSON list)", file=sys.stderr)
        return 2
    topo, extra = torchrun_env(os.environ)
    address = settings.LAUNCH_NOTIFY.raw()
    heartbeat = Heartbeat(address, topo) if address and topo.local_rank == 0 else None
    stopping: list[int] = []
    pin(topo.local_rank, settings.CPU_SHARE.raw())  # a stage sharing its node: its rank's cores
    raised = _raised_file()
    if raised:  # node-local: no shared file system's delay between the rank's write and this read
        extra[settings.RAISED.name] = raised
    if reads := _observing(address):  # (node-local too: no file per rank on the shared file system)
        extra.update(observing_env(reads, {**os.environ, **extra}, cmd))
    try:
        child = subprocess.Popen(cmd, env={**os.environ, **extra})
    except OSError as exc:
        print(f"parsl-torch: rank {topo.rank} on {topo.hostname}: cannot start {cmd[0]!r}: {exc.strerror}",
              file=sys.stderr, flush=True)
        code = 127
    else:
        def forward(signum, _frame):
            stopping.append(signum)
            child.send_signal(signum)

        for sig in _FORWARDED:
            signal.signal(sig, forward)
        if (deadline := deadline_from_env(os.environ)) is not None:
            signal_at_deadline(child, deadline)
        if address:
            watch_stopped(child, address, topo)
        code = child.wait()
    if code == 0:  # (CMD has not hydra's PMI socket: a rank it orphaned would keep a killed shim's launch up)
        finish_pmi()  # else the node's hydra proxy spins a core from this rank's end to the last rank's
    said = read_raised(raised) if raised else ""  # (and removed, whatever the exit)
    if code != 0 and not stopping:  # (first: the failure is named before anything else is told)
        report = RankReport(_rank_now(topo, address), topo.hostname, code, raised=said)
        if not (address and notify(address, asdict(report))):
            print(f"parsl-torch: {report}", file=sys.stderr, flush=True)
    if reads and address:  # (whatever the exit: a block's end, a retry or a rerun reads on from it)
        _report_reads(address, _rank_now(topo, address), reads)
    elif reads:
        shutil.rmtree(reads, ignore_errors=True)
    if heartbeat is not None:
        heartbeat.close(code)  # after the report: a failed rank is named as such, not as a lost node
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
