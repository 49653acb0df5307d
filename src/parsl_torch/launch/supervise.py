"""Run a launch plan so that nothing hangs and nothing is left behind.

* A rank that fails reports to a socket this process listens on (see
  ``shim``); the launch then stops all ranks and exits with that rank's code
  within seconds. mpiexec alone would wait for the other ranks forever.
* Each node's first shim keeps a heartbeat connection open: a node whose
  processes vanish, or that goes silent for settings.NODE_TIMEOUT seconds
  (default 10; a powered-off node sends nothing, not even a reset), is named
  with its ranks and everything is stopped. Without this the other nodes'
  ranks fail only at the collective timeout, naming themselves. A node whose
  processes vanished is then checked (``preflight``; this host needs none): one
  that answers was not lost, its ranks' processes were ended (by the program
  itself, an out-of-memory killer), an application failure (exit 137); one
  that does not is lost (exit 75) and quarantined in the block's job. A silent
  node is not checked again: its shim, which does nothing else, sent nothing
  for the node timeout (down, cut off or frozen: no use to the launch).
* ``timeout`` stops everything and exits 124; SIGINT/SIGTERM stop everything
  and exit 128+signal.
* A block that ends: the ranks get settings.DEADLINE (the block's end less
  the grace period, see ``common.blocks``); ranks that stop there exit 99
  (CONTINUE_EXIT) and so does this, as when the scheduler's SIGTERM comes
  after the deadline: the workflow submits the stage again.
* Stopping: SIGTERM to the launcher (mpiexec/srun/torchrun tear down their
  ranks, remote ones included) and its process group, then SIGKILL after a
  grace period. Finally any local process that still carries this launch's
  token in its environment is killed: Hydra's proxies start their own
  sessions, so a process group alone does not reach the ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from pathlib import Path

from ..common import settings, stagedir
from ..common.blocks import CONTINUE_EXIT, deadline_from_env
from ..common.entrypoints import SUPERVISE
from ..common.outcome import Cause, Outcome, continued, forget_outcome, read_outcome, timed_out, write_outcome
from ..common.procs import reap, stop
from ..common.runlock import LockWatch
from ..core.topology import free_port
from ..errors import TopologyError
from . import quarantine
from .cpushare import CpuShare, bound
from .events import (NODE_LOST_EXIT, Event, LauncherExited, NodeSilent, RankReport, blame_stopped, cause_within,
                     describe_exit, short)
from .listener import RankListener, short_queue
from .machines import get_machine
from .nodeloss import (LOSS_CHECK_S, blame, checked, ended, greeted, on_nodes_left, on_spare, overlapping, refuse_nodes,
                       relaunched)
from .nodeloss import say as _say
from .plan import LaunchPlan
from .preflight import silent_nodes
from .standby import Standby, kept

GRACE_S = 10.0
LOST_NODE_GRACE_S = 3.0
#: the block has too few nodes left for the stage (EX_UNAVAILABLE)
TOO_FEW_NODES_EXIT = 69
#: the workflow that started a stage is gone: nobody will use its result
ORPHANED_EXIT = 143
OWNER_CHECK_S = 3.0
#: seconds the other ranks have to end after one stopped for the block's end
CONTINUE_WAIT_S = 30.0
#: seconds a launch whose nodes' first shims all said bye after a rejoin leaves their other shims to end (their
#: reads said) before it stops the first launcher, which waits for the lost node's daemon
BYE_WAIT_S = 1.0
#: every rank exited 0 but a function stage's rank 0 left no return value
NO_RESULT_EXIT = 1


def _exit_code(code: int) -> int:
    return code if code >= 0 else 128 - code


def supervise(plan: LaunchPlan, timeout: float | None = None, grace: float = GRACE_S,
              owner: LockWatch | None = None, stage_dir: str | None = None, result: str | None = None,
              check_s: float = LOSS_CHECK_S, standby: Standby | None = None) -> int:
    """Run ``plan``; its exit code, or the failed rank's, 124 on timeout, 75 if a node was lost.
    ``owner``: a stage's workflow; if it goes away (killed, even with SIGKILL), everything is stopped.
    ``stage_dir``: where the launch's ``Outcome`` is recorded for the workflow. ``result``: the file
    rank 0 writes when the stage's function returns: ranks that all exit 0 without it failed.
    ``check_s``: seconds a node named lost has to answer a check (then it was not lost). ``standby``: a spare's
    ranks waiting beside the stage's, brought in for a lost node with the other nodes' ranks kept up."""
    if stage_dir:
        forget_outcome(stage_dir)
    started = time.time()
    if warning := short_queue(len(plan.nodes)):
        _say(warning)
    try:
        watch = _Watch(plan, timeout, grace, owner, lambda: asked_to_continue({**os.environ, **plan.env}, stage_dir, started),
                       standby)
    except TopologyError as exc:  # (too few open files for one connection per node: nothing started)
        return ended(stage_dir, Outcome(Cause.LAUNCHER_FAILED, 1, str(exc)))
    outcome = watch.run()
    if stage_dir and settings.OBSERVE.get(plan.env):  # (a failed launch's too: what its retry resumes read it)
        stagedir.add_reads(stage_dir, watch.listener.reads, len(watch.listener.read_ranks), plan.num_ranks)
    if outcome.cause is Cause.OK and result and not os.path.exists(result):
        outcome = no_result(result)
        _say(outcome.summary)
    if outcome.cause is Cause.NODE_LOST and outcome.host and not watch.silent:
        if stage_dir:  # (first: a scheduler that ends the job for the lost node ends this process during the check)
            write_outcome(stage_dir, dataclasses.replace(outcome, checking=check_s))
        outcome = checked(plan, outcome, check_s)
    if stage_dir:
        write_outcome(stage_dir, outcome)
    if outcome.cause is Cause.NODE_LOST and outcome.host and (path := settings.QUARANTINE.get()):
        if job := quarantine.job_of():  # the block's pool must not hand the node to another stage
            quarantine.add(path, job, outcome.host, outcome.summary)
    return outcome.exit_code


class _Watch:
    """One launch, watched until its ranks end: each event (``events``) becomes its ``Outcome``, or None
    while the ranks go on. ``continues``: whether an exit 99 is the stage's continuation (else it is a
    rank's failure)."""

    def __init__(self, plan: LaunchPlan, timeout: float | None, grace: float, owner: LockWatch | None,
                 continues: Callable[[], bool] = lambda: True, standby: Standby | None = None) -> None:
        self.plan, self.grace, self.owner, self.continues, self.standby = plan, grace, owner, continues, standby
        self.events: queue.Queue[Event] = queue.Queue()
        self.listener = RankListener(self.events, settings.NODE_TIMEOUT.get({**os.environ, **plan.env}), plan.nodes)
        self.env = {**os.environ, **plan.env, settings.LAUNCH_NOTIFY.name: self.listener.address}
        self.block_deadline = deadline_from_env(self.env)
        if self.block_deadline is not None:
            self.env[settings.DEADLINE.name] = f"{self.block_deadline:.3f}"
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout if timeout else None
        self.next_owner_check = time.monotonic() + OWNER_CHECK_S
        self.received: list[int] = []
        self.silent = False  # a node was named for its silence (the node timeout: no check needed after it)
        self.others = f"the other {plan.num_ranks - 1} rank(s)" if plan.num_ranks else "the other ranks"

    def run(self) -> Outcome:
        handlers = {sig: signal.signal(sig, lambda s, _f: self.received.append(s))
                    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        self.proc = subprocess.Popen(self.plan.argv, env=self.env, start_new_session=True)
        threading.Thread(target=lambda: self.events.put(LauncherExited(self.proc.wait())), daemon=True).start()
        if self.standby is not None:
            self.standby.start(self.env, self.events)
        try:
            while True:
                try:  # wakes at once for a report or the launcher's exit; signals within 0.2 s
                    event: Event | None = self.events.get(timeout=0.2)
                except queue.Empty:
                    event = None
                outcome = self._on(event) if event is not None else self._on_time()
                if outcome is not None:
                    return outcome
        finally:
            if self.standby is not None:
                self.standby.stop(self.grace)
            if self.proc.poll() is None:
                stop(self.proc, self.grace)
            reap(self.listener.token)
            self.listener.close()
            for sig, old in handlers.items():
                signal.signal(sig, old)

    def _on(self, event: Event) -> Outcome | None:
        if isinstance(event, NodeSilent):
            if self.standby is not None and self.standby.waiting(event.host, self.listener):
                self._spare_gone(event.host, "went silent" if event.kind == "lost" else "ended")
                return None
            if self.standby is not None and event.kind == "lost" and self._bring_in(event):
                return None
            return self._node_lost(event)
        if isinstance(event, RankReport):
            return None if event.preflight else self._rank_ended(event)
        if event.spare:  # (one brought in ends with its ranks, which say so themselves)
            if self.standby is not None and self.standby.waiting(event.spare, self.listener):
                self._spare_gone(event.spare, f"ended (their launcher {describe_exit(event.code)})")
            return None
        if self.standby is not None and self.standby.generation:
            return None  # (after a rejoin the launcher may wait for the lost node's daemon: the nodes' byes tell)
        return self._launcher_exited(event.code)

    def _bring_in(self, event: NodeSilent) -> bool:
        """A lost node's ranks taken by a spare's waiting ones, the others kept up (``standby``), said."""
        assert self.standby is not None
        spare = self.standby.bring_in(event.host, event.ranks, event.describe(), self.listener)
        if spare is None:
            return False
        self.plan = dataclasses.replace(self.plan, nodes=tuple(self.standby.hosts))
        _say(event.describe(lost=False))
        _say(f"node {event.host} lost: the stage goes on in place on the spare {spare} (the block's mpi.spare_nodes), "
             f"the same {self.plan.num_ranks} rank(s), from the state its ranks kept; the other nodes' ranks stay up "
             f"and the spare's have waited since the stage began (a fresh rendezvous; nothing launched)")
        return True

    def _ended_after_rejoin(self) -> Outcome:
        """Every node's first rank ended after a rejoin (their shims' byes say how): the launch's outcome. The
        first launcher may wait for the lost node's daemon for ever: stopped once the others have ended."""
        assert self.standby is not None
        self.standby.close(CONTINUE_WAIT_S)  # (the spare brought in: its launcher ends with its ranks)
        time.sleep(BYE_WAIT_S)
        stop(self.proc, min(self.grace, LOST_NODE_GRACE_S), done=lambda: not self.listener.connected())
        byes = {host: self.listener.byes.get(short(host)) for host in self.standby.hosts}
        failed = next(((host, code) for host, code in byes.items() if code != 0), None)
        if failed is None:
            return Outcome(Cause.OK, 0, "every rank finished")
        host, code = failed
        how = describe_exit(code) if code is not None else "ended without saying how"
        summary = (f"after the rejoin, the first rank on {host} {how} without a report (stopped by the launcher, "
                   f"which ends every node's ranks with a lost node's?)")
        _say(summary)
        return Outcome(Cause.LAUNCHER_FAILED, _exit_code(code) if code else 1, summary, host=host)

    def _spare_gone(self, host: str, what: str) -> None:
        """A spare whose waiting ranks ended or went silent: not brought in; a silent one is quarantined."""
        assert self.standby is not None
        _say(f"the spare {host}'s waiting ranks {what}: a lost node's ranks will start anew instead")
        if what == "went silent" and (path := settings.QUARANTINE.get()) and (job := quarantine.job_of()):
            quarantine.add(path, job, host, f"the waiting ranks of a stage on {','.join(self.plan.nodes)} went silent")
        self.standby.drop(host)

    def _node_lost(self, event: NodeSilent, stopping: bool = True) -> Outcome:
        event = blame(event, self.plan.nodes, greeted(self.listener, self.plan.nodes, event))
        self.silent = event.kind == "lost"
        if not stopping:  # (the launcher already ended)
            _say(event.describe(lost=False))
            return event.outcome()
        then = "" if self.silent else ", then checking the node"
        _say(f"{event.describe(lost=False)}; stopping {self.others}{then}")
        if self.standby is not None:
            self.standby.stop(min(self.grace, LOST_NODE_GRACE_S))
        # the lost node's processes cannot answer, and the launcher may wait for its daemon there: ended
        # once every other node's shims have (their ranks are gone; a new launch may take their devices)
        stop(self.proc, min(self.grace, LOST_NODE_GRACE_S), done=lambda: not self.listener.connected())
        return event.outcome()

    def _rank_ended(self, report: RankReport) -> Outcome:
        report = blame_stopped(report, self.listener.stopped)
        if report.code == CONTINUE_EXIT and self.continues():
            _say(f"rank {report.rank} on {report.host} stopped for the block's end; the stage continues in the next "
                 f"block")
            try:
                self.proc.wait(timeout=CONTINUE_WAIT_S)  # the others stop at the same step
            except subprocess.TimeoutExpired:
                _say(f"the other ranks did not end within {CONTINUE_WAIT_S:g} s; stopping them")
                stop(self.proc, self.grace)
            return continued(CONTINUE_EXIT, rank=report.rank, host=report.host)
        # a lost node or a SIGKILLed rank makes the ranks elsewhere fail too: name the cause if it follows at once
        cause = cause_within(self.events, 1.0, report)
        if isinstance(cause, NodeSilent):
            _say(str(report))
            return self._node_lost(cause)
        if cause is not None:
            _say(str(report))  # (what the kill did to a peer)
            report = blame_stopped(cause, self.listener.stopped)
        if self.plan.num_ranks == 1:  # no other rank to stop, no launcher's word on them to explain
            _say(str(report))
            stop(self.proc, self.grace)
            return rank_outcome(report)
        _say(f"{report}; stopping {self.others}")
        stop(self.proc, self.grace)
        # the launcher may have printed its own word on the ranks we stopped (MPICH's
        # "BAD TERMINATION ... EXIT CODE: 9"): the last line names the cause again
        _say(f"{report} (the cause: what the launcher printed after it is about the ranks stopped)")
        return rank_outcome(report)

    def _launcher_exited(self, status: int) -> Outcome:
        code = _exit_code(status)
        if code == CONTINUE_EXIT and self.continues():
            _say("the ranks stopped for the block's end; the stage continues in the next block")
            return continued(code)
        if not code:
            return Outcome(Cause.OK, 0, "every rank finished")
        with contextlib.suppress(queue.Empty):  # name the rank (or the lost node) if its report is near
            event = self.events.get(timeout=1.0)
            if isinstance(event, NodeSilent):
                return self._node_lost(event, stopping=False)
            if isinstance(event, RankReport) and not event.preflight:
                event = blame_stopped(event, self.listener.stopped)
                _say(str(event))
                return rank_outcome(event, code)
        return Outcome(Cause.LAUNCHER_FAILED, code, f"the launcher {describe_exit(status)}")

    def _on_time(self) -> Outcome | None:
        """A signal, the workflow gone, the walltime over: checked between events."""
        n = self.plan.num_ranks
        if self.standby is not None and self.standby.finished(self.listener):
            return self._ended_after_rejoin()
        if self.received:
            name = signal.Signals(self.received[0]).name
            ending = self.block_deadline is not None and time.time() >= self.block_deadline
            _say(f"received {name}{' after the deadline: the block is ending' if ending else ''}; stopping {n} rank(s)")
            stop(self.proc, self.grace)
            if ending:
                _say("the stage continues in the next block from its last checkpoint")
                return continued(CONTINUE_EXIT, "the block ended")
            return Outcome(Cause.SIGNALLED, 128 + self.received[0], f"stopped by {name}")
        if self.owner is not None and time.monotonic() > self.next_owner_check:
            self.next_owner_check = time.monotonic() + OWNER_CHECK_S
            if why := self.owner.gone():
                _say(f"{why}; stopping {n} rank(s)")
                stop(self.proc, self.grace)
                return Outcome(Cause.ORPHANED, ORPHANED_EXIT, why)
        if self.deadline and time.monotonic() > self.deadline:
            _say(f"timed out after {self.timeout:g} s; stopping {n} rank(s)")
            stop(self.proc, self.grace)
            return timed_out(self.timeout)
        return None


def asked_to_continue(env: Mapping[str, str], stage_dir: str | None, since: float) -> bool:
    """Whether an exit 99 of a launch (cold) or a call (warm) that began at ``since`` continues the stage in
    its next block: where the block has an end (``env``), or where the stage said so itself
    (``pt.to_be_continued()`` recorded its step since then); else it is a rank's failure."""
    if deadline_from_env(env) is not None:
        return True
    record = stagedir.read_or_none(Path(stage_dir, stagedir.CONTINUATION), stagedir.ContinuationRecord) \
        if stage_dir else None
    return record is not None and record.time >= since


def no_result(result: str) -> Outcome:
    """Every rank exited with code 0 and rank 0's value file ``result`` is not there (a warm call's too)."""
    return Outcome(Cause.NO_RESULT, NO_RESULT_EXIT, (
        f"every rank exited with code 0, but rank 0 never returned a value ({os.path.basename(result)} was not "
        f"written): the stage's function ended its process before it returned (os._exit(0)? a library that "
        f"exits?)"), rank=0)


def rank_outcome(report: RankReport, code: int | None = None) -> Outcome:
    """A failed rank's outcome (a warm call's too: ``apps.warm.rank``), its summary the report's line."""
    summary = str(report)
    if report.code == CONTINUE_EXIT:  # (one that continues the stage never gets here)
        summary += (f" (exit code {CONTINUE_EXIT} continues a stage in its next block only at its block's end or "
                    f"through pt.to_be_continued(): neither happened)")
    return Outcome(Cause.RANK_FAILED, _exit_code(report.code) if code is None else code, summary,
                   report.rank, report.host)


def record_block(stage_dir: str, env: Mapping[str, str], skipped: bool = False) -> None:
    """Which block this attempt runs in, when that block ends, whether the attempt was skipped there
    (the block was past its deadline), and the accelerators it holds on a node it shares:
    ``parsl-torch status`` and the workflow read it."""
    with contextlib.suppress(OSError):
        stagedir.write(Path(stage_dir, stagedir.BLOCK), stagedir.BlockRecord(
            env.get("PARSL_WORKER_BLOCK_ID"), settings.BLOCK_END.get(env), deadline_from_env(env), time.time(), skipped,
            settings.ACCELERATORS.get(env) or None))


def _arguments(argv: list[str]) -> tuple[Any, list[str]]:
    """(the supervisor's options, the launch command after ``--``)."""
    import argparse

    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog=f"python -m {SUPERVISE}")
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--ranks", type=int, default=0, help="for messages only")
    parser.add_argument("--preflight", type=float, default=0, help="seconds each node has to answer first")
    parser.add_argument("--env-file", help="a JSON object of variables for the ranks (kept off the command line)")
    parser.add_argument("--result", help="the file rank 0 writes when the function returns: without it the launch failed")
    parser.add_argument("--in-place", action="store_true",
                        help="after a lost node, go on in place: on a spare of the block's, else (--min-nodes) on the nodes left")
    parser.add_argument("--min-nodes", type=int, default=0, help="with --in-place: on as few nodes left")
    parser.add_argument("--keep-ranks", action="store_true",
                        help="with --in-place: a function stage's ranks, kept up through a lost node with a spare's "
                             "waiting beside them")
    opts = parser.parse_args(argv[:split])
    if not argv[split + 1:]:
        parser.error("no command after --")
    return opts, argv[split + 1:]


def _launch_of(command: list[str], hosts: list[str], env_file: str | None) -> tuple[list[str], dict[str, str]]:
    """The command as this block runs it, and the ranks' environment: a fresh rendezvous, the stage's
    variables, and on a shared node its accelerators and cores."""
    command = _on_this_node(command)
    if (path := settings.QUARANTINE.get()) and quarantine.lost_nodes(path, quarantine.job_of()):
        command = list(overlapping(command))  # the lost node's step may still hold the nodes left
    # the rendezvous belongs to this task: values inherited from the workflow's
    # shell would make concurrent stages on one node share a port
    env = {"MASTER_ADDR": hosts[0] or "127.0.0.1", "MASTER_PORT": str(free_port())}
    if env_file:
        with open(env_file) as f:
            env = {**json.load(f), **env}
    if shared := settings.ACCELERATORS.get():  # the stage shares its node: its ranks see only its own
        variable, _, ids = shared.partition("=")
        env[variable] = ids
        _say(f"this stage shares node {hosts[0]}: its ranks see accelerator(s) {ids} ({variable})")
        if share := CpuShare.parse(settings.CPU_SHARE.get()):  # and the cores that go with them
            command, rank_env = bound(command, share, get_machine(settings.MACHINE.get()), _cpus_on_node())
            env.update(rank_env)
    return command, env


def _on_this_node(command: list[str]) -> list[str]:
    """``command`` with the Python the block put on its nodes' own storage, where it did."""
    if node_python := settings.NODE_PYTHON.get():
        return [node_python if arg == sys.executable else arg for arg in command]
    return command


def _cpus_on_node() -> int:
    """The CPUs of a node of this job (Slurm's count for the job's nodes, else this host's)."""
    value = os.environ.get("SLURM_CPUS_ON_NODE", "")
    return int(value) if value.isdigit() else os.cpu_count() or 1


def _ranks_given(asked: int) -> int:
    """The ranks Parsl's MPI task was given: fewer than ``asked`` when the block lost nodes and the
    stage's min_nodes let it start on the nodes left (``launch.pool``), which is said here."""
    try:
        given = int(os.environ.get("PARSL_NUM_RANKS", ""))
    except ValueError:
        return asked
    if asked and given < asked:
        _say(f"starting {given} of {asked} rank(s), on {os.environ.get('PARSL_NUM_NODES', '?')} node(s): the block "
             f"lost nodes and the stage's min_nodes ({os.environ.get('PARSL_MIN_NODES', '?')}) allows it")
    return given


def main(argv: list[str] | None = None) -> int:
    """``python -m parsl_torch.launch.supervise [--timeout S] [--ranks N] -- LAUNCHER ARGV...``

    Supervises an already built launch command (a Parsl MPI task's
    ``$PARSL_MPI_PREFIX ...``): rendezvous on the first host of
    ``PARSL_MPI_NODELIST`` at a fresh port, fail fast, time out, leave nothing
    behind.
    """
    opts, given = _arguments(sys.argv[1:] if argv is None else argv)
    hosts = os.environ.get("PARSL_MPI_NODELIST", "").split(",")
    command, env = _launch_of(given, hosts, opts.env_file)
    if unstaged := settings.NODE_PYTHON_UNSTAGED.get():
        _say(f"node_local_python: {unstaged}")
    ranks = _ranks_given(opts.ranks)
    plan = LaunchPlan(tuple(command), command[0], "parsl", None, 0, 0, ranks,
                      tuple(h for h in hosts if h), env)
    run_dir = settings.RUN_DIR.raw(env)
    block_deadline = deadline_from_env({**os.environ, **env})
    late = block_deadline is not None and time.time() >= block_deadline
    stage_dir = settings.STAGE_DIR.get(env)
    if stage_dir:
        record_block(stage_dir, {**os.environ, **env}, skipped=late)
    if short := settings.NODES_SHORT.get():  # the block's pool could not give it its nodes
        return ended(stage_dir, Outcome(Cause.TOO_FEW_NODES, TOO_FEW_NODES_EXIT, short))
    if late:  # a block past its deadline took the stage before it stopped taking new ones
        return ended(stage_dir, continued(CONTINUE_EXIT, "the block was past its deadline"),
                     "this block is past its deadline: the stage was not started here and goes to the next block")
    if opts.preflight and len(plan.nodes) > 1 and (silent := silent_nodes(plan, opts.preflight)):
        return refuse_nodes(silent, stage_dir)
    owner, started = LockWatch(run_dir) if run_dir else None, time.time()
    prefix = shlex.split(os.environ.get("PARSL_MPI_PREFIX", ""))  # (Parsl's launch prefix, which ``given`` starts with)
    standby = _standby(opts, given, prefix, hosts)
    if standby is not None:
        plan = dataclasses.replace(plan, argv=tuple(kept(command)), env={**env, settings.KEEP_RANKS.name: "1"})
    code = supervise(plan, timeout=opts.timeout, owner=owner, stage_dir=stage_dir, result=opts.result,
                     check_s=opts.preflight or LOSS_CHECK_S, standby=standby)
    if standby is not None:  # (a rejoin put a spare in a lost node's place)
        given, hosts, prefix = standby.given, standby.hosts, standby.given[:len(prefix)]
    while code == NODE_LOST_EXIT and stage_dir and (left := _in_place(opts, given, prefix, hosts, stage_dir)):
        given, hosts = left  # (in place: no new launch through Parsl; the ranks resume from node memory)
        forget_outcome(stage_dir)  # (the stage goes on: the workflow must not end it on the last launch's record)
        prefix = given[:len(prefix)]
        command, env = _launch_of(given, hosts, opts.env_file)
        plan = LaunchPlan(tuple(command), command[0], "parsl", None, 0, 0, len(hosts) * _ranks_per_node(), tuple(hosts),
                          env)
        if silent := silent_nodes(plan, opts.preflight or LOSS_CHECK_S):  # (a spare may be dead itself)
            code = refuse_nodes(silent, stage_dir, in_place=True)
            continue
        timeout = None if opts.timeout is None else max(opts.timeout - (time.time() - started), 1.0)
        code = supervise(plan, timeout=timeout, owner=owner, stage_dir=stage_dir, result=opts.result,
                         check_s=opts.preflight or LOSS_CHECK_S)
    return code


def _standby(opts: Any, given: list[str], prefix: list[str], hosts: list[str]) -> Standby | None:
    """A spare's ranks to wait beside a function stage's: where it goes on in place and its block holds spares."""
    if not (opts.keep_ranks and opts.in_place and settings.WAITING_SPARES.get() and settings.QUARANTINE.get()
            and quarantine.job_of()):
        return None
    standby = Standby.of(given, prefix, hosts, _ranks_per_node(), (settings.SPARES.get() or "").split(","))
    if standby is not None:
        standby.spares = {spare: _on_this_node(argv) for spare, argv in standby.spares.items()}
    return standby


def _ranks_per_node() -> int:
    value = os.environ.get("PARSL_RANKS_PER_NODE", "")
    return int(value) if value.isdigit() else 0


def _in_place(opts: Any, given: list[str], prefix: list[str], hosts: list[str],
              stage_dir: str) -> tuple[list[str], list[str]] | None:
    """After a lost node, the launch that goes on in place, said: the same ranks with a spare of the block's in
    the lost node's place, else on the nodes left where the stage's min_nodes allows. None where it cannot (the
    stage fails, and its retry goes through Parsl)."""
    outcome = read_outcome(stage_dir)
    per_node = _ranks_per_node()
    if not opts.in_place or outcome is None or outcome.cause is not Cause.NODE_LOST or not outcome.host or not per_node \
            or relaunched(given, prefix, hosts, per_node) is None:  # (not a launch of Parsl's prefix: none in place)
        return None
    lost, path, job = outcome.host, settings.QUARANTINE.get(), quarantine.job_of()
    offered = (settings.SPARES.get() or "").split(",")
    if path and job and (spare := quarantine.claim_spare(path, job, offered, os.environ.get("PARSL_MPI_NODELIST", ""))):
        _say(f"node {lost} lost: the stage goes on in place on the spare {spare} (the block's mpi.spare_nodes), "
             f"the same {len(hosts) * per_node} rank(s), from the state its ranks kept")
        return on_spare(given, prefix, hosts, lost, spare, per_node)
    left = on_nodes_left(given, prefix, hosts, lost, per_node) if opts.min_nodes else None
    if left is None or len(left[1]) < opts.min_nodes:
        return None
    _say(f"node {lost} lost: the stage goes on in place on the {len(left[1])} node(s) left "
         f"({', '.join(left[1])}), {len(left[1]) * per_node} rank(s) (its min_nodes is {opts.min_nodes}), "
         f"from the state its ranks kept")
    return left


if __name__ == "__main__":
    sys.exit(main())
