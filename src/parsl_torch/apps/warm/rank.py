"""``python -m parsl_torch.apps.warm.rank GROUP_DIR``: one rank of a warm group (``pt.workflow(warm=True)``).

Started once, as a cold stage's ranks are (supervisor, shim), it is a *prepared parent*: Python started,
torch and what every call's ranks load imported (``stage.kept.PRELOAD``), and nothing else: no process group, no
accelerator context, no thread, none of the user's modules. Each call runs in a fresh fork of it, which
starts as a cold rank does (``stage.main``: device, process group, the payload, rank 0's result) in the
stage's directory, with the stage's environment and output files. Whatever a call changes (torch's flags,
a patched module, the environment, a signal handler, a thread left running) dies with its child: the next
call forks the parent again, as a preforking server or Android's zygote does. So nothing has to be put
back, and a module edited between calls is imported anew by the next child.

The ranks agree through files in the group's directory, not a process group (the parent has none): rank 0
takes job ``n`` and names the call's rendezvous port (``<n>.started``); every rank's parent forks, waits
for its child and leaves a report (``<n>.rank<r>.json``: its exit, the exception that ended it, what it
read); a failed child's parent says so (``<n>.failed``) and the others stop theirs, as a cold launch
stops its ranks. Rank 0 merges the reports into the call's outcome (``<n>.done``) and the stage's record
of reads. A call that fails, hangs past its walltime or is killed ends its children only: the group goes
on. Script stages run cold: a script owns its process.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from ...common import settings, stagedir
from ...common.blocks import CONTINUE_EXIT
from ...common.entrypoints import WARM_RANK, internal_arguments
from ...common.files import write_atomic
from ...observe.recorder import begin_call, begin_reads, observed_any, reads_of
from ...common.outcome import Outcome, continued, timed_out
from ...common.raised import claim_first, first_claimed, read_raised
from ...core.topology import env_topology, free_port
from ...launch.events import RankReport
from ...launch.shim import catches
from ...launch.supervise import asked_to_continue, no_result, rank_outcome
from ..stage.kept import FORWARDED, STOPS, child_start, fork_safe, prepare, run_fork
from ..stage.main import main as stage_main

#: the first and the longest pause between a waiting rank's looks at the group's directory (an idle group
#: stops after a few seconds: ``groups.IDLE_S``)
POLL_S, POLL_MAX_S = 0.001, 0.05
#: how often a parent waiting for its child looks whether another rank failed or the walltime passed
CHECK_S = 0.05
#: how long a child that is asked to stop (a peer failed, its walltime passed) has before SIGKILL
STOP_GRACE_S = 5.0
#: signals the parent passes to its child: those that stop the group after the call, and those a child
#: gets only if it catches them (SIGUSR1: the block's end, for ``pt.should_checkpoint``)
#: the job files in a group's directory: jobs/<n>.json, written by the workflow; the ranks' markers beside it
JOBS = "jobs"
STOP = "stop"


def job_path(group_dir: str | os.PathLike, n: int, kind: str = "json") -> Path:
    return Path(group_dir, JOBS, f"{n}.{kind}")


class _Parent:
    """One rank's prepared parent: takes each job, forks it, reports how its child ended."""

    def __init__(self, group_dir: str) -> None:
        topo = env_topology()
        self.dir, self.rank, self.world, self.host = group_dir, topo.rank, topo.world_size, socket.gethostname()
        self.child: int | None = None
        self.ending: int | None = None  # a stop signal: the group ends after the call
        self.handlers = {sig: signal.getsignal(sig) for sig in FORWARDED}  # (a child gets them back)
        for sig in FORWARDED:
            signal.signal(sig, self._forward)

    def _forward(self, signum: int, _frame: Any) -> None:
        if signum in STOPS:
            self.ending = signum
        if self.child is not None:
            if signum in STOPS or catches(self.child, signum):  # (SIGUSR1's default would end the child)
                with contextlib.suppress(OSError):
                    os.kill(self.child, signum)
        elif self.ending is not None:
            sys.exit(128 + signum)

    def serve(self) -> int:
        n = 0
        while True:
            taken = self._next_job(n)
            if taken is None:
                return 0
            job, port = taken
            since = time.time()
            self._report(n, *self._run(n, job, port))
            if self.rank == 0:
                _finish(self.dir, n, job, self.world, since)
            if self.ending is not None:
                return 128 + self.ending
            n += 1

    def _next_job(self, n: int) -> tuple[stagedir.WarmJob, int] | None:
        """Job ``n`` and its rendezvous port, or None when the group stops. Rank 0 decides (the workflow
        asked it to stop, or the block is about to end); the others follow its markers."""
        path, started, stopped = job_path(self.dir, n), job_path(self.dir, n, "started"), job_path(self.dir, n, "stop")
        pause = POLL_S
        while self.ending is None:
            if self.rank == 0:
                if path.exists():
                    port = free_port()
                    write_atomic(started, str(port))
                    return stagedir.read(path, stagedir.WarmJob), port
                deadline = settings.DEADLINE.get()
                if Path(self.dir, STOP).exists() or (deadline is not None and time.time() >= deadline):
                    write_atomic(stopped, "")
                    return None
            elif started.exists():
                return stagedir.read(path, stagedir.WarmJob), int(started.read_text())
            elif stopped.exists():
                return None
            time.sleep(pause)
            pause = min(2 * pause, POLL_MAX_S)
        return None

    def _run(self, n: int, job: stagedir.WarmJob, port: int) -> tuple[int, str]:
        """Fork the call, wait for its child; its exit code, and what the parent did to it ("" or why it
        was stopped)."""
        if (folder := settings.READS_DIR.get()) is not None:
            begin_call(folder)  # (what this call reads is its child's: ``observe.recorder``)
        fork_safe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            os.environ[settings.FIRST_FAILURE.name] = f"{self.rank}:{job_path(self.dir, n, 'failed')}"
            _child(job, port, self.handlers)
        self.child = pid
        try:
            return self._wait(n, job, pid)
        finally:
            self.child = None

    def _wait(self, n: int, job: stagedir.WarmJob, pid: int) -> tuple[int, str]:
        """Until the child ends (its pidfd wakes this at once); it is stopped (SIGTERM, then SIGKILL after
        STOP_GRACE_S) when another rank's child failed or the call's walltime passed."""
        failed, started, stopped, why = job_path(self.dir, n, "failed"), time.monotonic(), None, ""
        sent: set[int] = set()
        ended = os.pidfd_open(pid)
        try:
            while not select.select([ended], [], [], CHECK_S)[0]:
                if stopped is None:
                    # (not for its own child's claim: that child raised, and ends by itself)
                    if failed.exists() and first_claimed(failed) != self.rank:
                        why = "peer"
                    elif job.walltime and time.monotonic() - started >= job.walltime:
                        why = "walltime"
                    if why:
                        stopped = time.monotonic()
                        sent.add(signal.SIGTERM)
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGTERM)
                elif time.monotonic() - stopped > STOP_GRACE_S:
                    sent.add(signal.SIGKILL)
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
        finally:
            os.close(ended)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        # a child killed by a signal this parent did not send died of its own (a SIGKILL from outside, which
        # ended it while a peer whose collective it broke claimed the failure first): not stopped, the cause
        return code, ("" if code < 0 and -code not in sent else why)

    def _report(self, n: int, code: int, stopped: str) -> None:
        folder = settings.READS_DIR.get()  # (first: what the parent opens from here on is not the call's)
        reads = sorted(reads_of(folder)) if folder is not None and observed_any(folder) else None
        raised = read_raised(path) if (path := settings.RAISED.get()) else ""
        if code not in (0, CONTINUE_EXIT) and not stopped:  # the first failure: the other ranks stop theirs
            claim_first(job_path(self.dir, n, "failed"), self.rank)  # (made already if its child raised)
        stagedir.write(job_path(self.dir, n, f"rank{self.rank}"),
                       stagedir.WarmReport(code, self.host, raised, stopped, reads))


def _child(job: stagedir.WarmJob, port: int, handlers: dict) -> NoReturn:
    """The call, in a fresh fork: a cold rank's start, then ``stage.main``'s run; never returns."""
    run_fork(lambda: _start_as_a_cold_rank(job, port, handlers),
             lambda: stage_main([job.file(stagedir.PAYLOAD), job.file(stagedir.RESULT)]))


def _start_as_a_cold_rank(job: stagedir.WarmJob, port: int, handlers: dict) -> None:
    """What differs between the parent and a cold rank of the call: signal handlers, its death with the
    parent, its RNGs' seeds, the stage's environment, directory and output files, the call's rendezvous."""
    child_start(handlers)
    import torch

    torch.seed()  # fresh entropy, as a new process's RNGs have (a fork inherits its parent's state)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    with open(job.file(stagedir.ENV)) as f:
        os.environ.update(json.load(f))
    os.environ["MASTER_PORT"] = str(port)
    begin_reads()
    sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.chdir(job.stage_dir)
    for fd, name in ((1, stagedir.STDOUT), (2, stagedir.STDERR)):  # (appending: the ranks share them)
        target = os.open(job.file(name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(target, fd)
        os.close(target)


def _finish(group_dir: str, n: int, job: stagedir.WarmJob, world: int, since: float) -> None:
    """Rank 0, once every rank reported call ``n`` (begun at ``since``): the reads added to the stage's (as a
    cold stage's supervisor adds them), then the call's outcome (``<n>.done``: empty when every rank finished)."""
    reports: list[stagedir.WarmReport] = []
    pause = POLL_S
    for rank in range(world):
        path = job_path(group_dir, n, f"rank{rank}")
        while (report := stagedir.read_or_none(path, stagedir.WarmReport)) is None:
            time.sleep(pause)
            pause = min(2 * pause, POLL_MAX_S)
        reports.append(report)
    told = [r.reads for r in reports if r.reads is not None]
    if told or settings.READS_DIR.get() is not None:
        stagedir.add_reads(job.stage_dir, (line for reads in told for line in reads), len(told), world)
    first = job_path(group_dir, n, "failed")
    continues = any(r.code == CONTINUE_EXIT for r in reports) and asked_to_continue(os.environ, job.stage_dir, since)
    outcome = call_outcome(reports, job.walltime, first_claimed(first), continues)
    if outcome is None and not os.path.exists(job.file(stagedir.RESULT)):
        outcome = no_result(job.file(stagedir.RESULT))
    if outcome is not None:
        with contextlib.suppress(OSError), open(job.file(stagedir.STDERR), "a") as f:
            f.write(f"parsl-torch: {outcome.summary}\n")
    write_atomic(job_path(group_dir, n, "done"), outcome.to_json() if outcome is not None else "")


def call_outcome(reports: list[stagedir.WarmReport], walltime: float | None, first: int | None,
                 continues: bool) -> Outcome | None:
    """How a call ended, from its ranks' reports (``first``: the rank that failed first), worded as a cold
    launch's supervisor words it; None: every rank finished. ``continues``: an exit 99 was asked for
    (``launch.supervise.asked_to_continue``); else it is a rank's failure, as in a cold launch."""
    if all(r.code == 0 for r in reports):
        return None
    if any(r.stopped == "walltime" for r in reports):
        return timed_out(walltime)
    if first is None:
        if continues and all(r.code in (0, CONTINUE_EXIT) for r in reports):
            return continued(CONTINUE_EXIT)
        first = next(i for i, r in enumerate(reports) if r.code != 0)  # (a signal from outside: no failure first)
    # a rank killed by a signal its parent did not send (SIGKILL, the OOM killer) makes its peers raise at
    # once (gloo: "Connection closed by peer"), and one of them may be the first to report: the kill is the cause
    killed = [i for i, r in enumerate(reports) if r.code < 0 and not r.raised and not r.stopped]
    first = killed[0] if killed and reports[first].code >= 0 else first
    report = reports[first]
    return rank_outcome(RankReport(first, report.host, report.code, raised=report.raised))


def main(argv: list[str] | None = None) -> int:
    if (argv := internal_arguments(WARM_RANK, argv, "GROUP_DIR", "started by a warm workflow")) is None:
        return 2
    prepare()
    return _Parent(argv[0]).serve()


if __name__ == "__main__":
    sys.exit(main())
