"""A cold stage's rank kept up through a lost node: a prepared parent that forks its training.

With a spare's ranks waiting beside a function stage (``settings.KEEP_RANKS``, set by the supervisor),
each rank starts as a warm rank's parent does (Python, torch and the stages imported; no process group,
no thread, no accelerator context) and forks the stage's run. When a node is lost the supervisor sends
a rejoin (``launch.rejoin``): each parent kills its child, wherever it hangs (a collective waiting on
the lost node cannot be interrupted otherwise: gloo's abort does not end a pending one), and forks a new
one at the fresh rendezvous; the spare's waiting parents fork theirs as the lost node's ranks. The new
children resume from the state the ranks kept in node memory (``core.snapshot``). What a restart of
every rank costs at scale (the launcher's start across the nodes, Python's and torch's imports from a
shared file system) is paid once, at the stage's start.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from ...common import settings
from ...common.entrypoints import stage_module
from ...common.gcpause import paused_gc
from ...core.dist import exit_process
from ...launch import rejoin
from ...launch.shim import catches
from ...observe.recorder import unobserved

#: what a prepared parent imports before its first fork (what every rank loads: torch, its process
#: groups, DDP, whose construction imports torch._dynamo: 2.5 s of CPU a process; the payload's loader,
#: the built-in stages and their history files); a user's module is never among them
PRELOAD = ("numpy", "dill", "torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "h5py",
           stage_module("train"), stage_module("evaluate"))
#: how often a parent looks at its node's rejoin file while its child runs
POLL_S = 0.02
#: how long a parent whose child failed waits for a rejoin before it reports the failure: a child whose
#: peer was killed for a rejoin fails at once, maybe before its own parent has read the word
HOLD_S = 0.5
STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORWARDED = (*STOPS, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1


def fork_safe() -> None:
    """Raise unless this process may fork a call: a thread may hold a lock that stays held forever in
    the child, and CUDA, XPU and ROCm cannot be used in the fork of a process that initialised them, nor
    a process group's connections shared by two processes."""
    import torch

    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if threads:
        raise RuntimeError(f"a warm rank's parent must not fork with threads running: {', '.join(threads)}")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        raise RuntimeError("a warm rank's parent must not fork with a process group: its children make their own")
    for kind in ("cuda", "xpu"):
        backend = getattr(torch, kind, None)
        if backend is not None and backend.is_initialized():
            raise RuntimeError(f"a warm rank's parent must not fork with {kind} initialised: its children set up "
                               f"their device")


def child_start(handlers: dict[int, Any]) -> None:
    """In a parent's fresh fork: the signal handlers a new process has, and its death with the parent."""
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    parent = os.getppid()
    with contextlib.suppress(Exception):  # (Linux: a child whose parent is killed ends with it)
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # (killed before the line above)
        os._exit(1)


def run_fork(start: Callable[[], None], run: Callable[[], int]) -> NoReturn:
    """A prepared parent's fork: ``start`` (what it changes), then ``run`` (the rank's, its exit code); never
    returns: an exception that escaped would carry on with the parent's loop in the fork."""
    code = 1
    try:
        start()
        code = run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - anything before the call's own code: reported, then the fork ends
        with unobserved():
            traceback.print_exc()
    finally:
        exit_process(code)


class _Kept:
    """The parent: forks ``attempt``, and again at each rejoin; its exit code is its last child's."""

    def __init__(self, attempt: Callable[[], int]) -> None:
        self.attempt, self.child, self.ending = attempt, None, False
        self.token = rejoin.token_of(settings.LAUNCH_NOTIFY.raw()) or ""
        self.host = socket.gethostname()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.handlers = {sig: signal.getsignal(sig) for sig in FORWARDED}
        for sig in FORWARDED:
            signal.signal(sig, self._forward)

    def _forward(self, signum: int, _frame: Any) -> None:
        self.ending = self.ending or signum in STOPS  # (asked to stop: no fork after this one)
        if self.child is None:
            if signum in STOPS:  # (a spare's waiting rank, stopped with its stage: nothing to finish)
                os._exit(128 + signum)
        elif signum in STOPS or catches(self.child, signum):  # (SIGUSR1's default would end the child)
            with contextlib.suppress(OSError):
                os.kill(self.child, signum)

    def run(self) -> int:
        generation, env = 0, {}
        if settings.STANDBY.get():  # a spare's rank: it waits for the lost node's ranks
            while (word := self._word(generation)) is None or (env := self._env(word)) is None:
                time.sleep(POLL_S)
            generation = word.generation
        while True:
            fork_safe()
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            pid = os.fork()
            if pid == 0:
                run_fork(lambda: self._start(env), self.attempt)
            self.child = pid
            code, word = self._wait(pid, generation)
            self.child = None
            if word is None or self.ending or (env := self._env(word)) is None:  # (not the launch's node now: ends)
                return code
            generation = word.generation

    def _start(self, env: dict[str, str]) -> None:
        """What the fork changes: its signal handlers, its rank and rendezvous."""
        child_start(self.handlers)
        os.environ.pop(settings.STANDBY.name, None)  # (a rank now)
        os.environ.update(env)

    def _word(self, after: int) -> rejoin.Rejoin | None:
        word = rejoin.read(self.token) if self.token else None
        return word if word is not None and word.generation > after else None

    def _env(self, word: rejoin.Rejoin) -> dict[str, str] | None:
        return word.rank_env(self.host, self.local_rank, self.local_world)

    def _wait(self, pid: int, generation: int) -> tuple[int, rejoin.Rejoin | None]:
        """The child's exit code, and the rejoin that ended it (None: it ended by itself)."""
        ended, word, failed_at = os.pidfd_open(pid), None, None
        try:
            while True:
                if failed_at is not None:
                    time.sleep(POLL_S)
                elif select.select([ended], [], [], POLL_S)[0]:
                    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                    if code == 0:
                        return 0, None
                    failed_at = time.monotonic()
                if (word := self._word(generation)) is not None:
                    break
                if failed_at is not None and time.monotonic() - failed_at > HOLD_S:
                    return code, None
        finally:
            os.close(ended)
        if failed_at is None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        return 1, word


def prepare() -> None:
    """Import ``PRELOAD`` (frozen: a collection does not copy them into each child, ``common.gcpause``) and
    leave the environment as it was before (torch's inductor sets ``TORCHINDUCTOR_CACHE_DIR``): a fork
    starts with what a cold rank starts with."""
    before = dict(os.environ)
    with paused_gc(freeze=True):
        for name in PRELOAD:
            importlib.import_module(name)
    for name in set(os.environ) - set(before):
        del os.environ[name]
    os.environ.update((k, v) for k, v in before.items() if os.environ.get(k) != v)


def keep(attempt: Callable[[], int]) -> int:
    """Run ``attempt`` (a rank's whole run, its exit code) in a fork of this prepared process, again at
    each rejoin; the last child's exit code."""
    prepare()
    return _Kept(attempt).run()
