"""``pt.workflow(warm=True)``: stages of one shape run in ranks that are already up.

Parsl's MPI mode starts a task's ranks anew for every task: Python, ``import torch``, the
process group, each time. In a warm workflow a function stage is a Parsl app on the
workflow's ``warm`` thread executor instead (the same identity, memoization, retries and
continuations as a cold stage), which hands the call to a *group*: ranks started once, as a
cold stage's are (an MPI task on the site's executor: supervisor, shim), each a prepared
parent that runs every call in a fresh fork of itself (``apps.warm.rank``). Groups are kept
by shape (site, nodes, ranks per node, launch flags, environment): at most as many per shape
as the site runs stages at once, each stopped after ``IDLE_S`` without a call (its nodes go
back to the block) and when the workflow ends. A call that fails fails its stage as a cold one
does (the rank named, its traceback in the stage's stderr); its group goes on. A lost node
ends the group (its supervisor's outcome is the call's). Script stages run cold: a script
owns its process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...common import settings, stagedir
from ...common.entrypoints import WARM_RANK
from ...common.files import write_atomic
from ...common.outcome import Cause, Outcome, read_outcome, timed_out, write_outcome
from ...common.stagedir import RESULT, STDERR, STDOUT
from ...core.log import get_logger
from ...sites.build import WARM_LABEL
from ...sites.capacity import stages_at_once
from ..stage.call import StageCall
from ..stage.options import StageOptions
from ..session.placement import Placement
from ..stage.cold import bash_app_for, prepare_call
from .rank import JOBS, STOP, job_path

#: seconds an idle group waits for its next call before it stops
IDLE_S = 5.0
#: how often a waiting call looks for its done file
POLL_S = 0.003
#: groups in a row that may stop (their block ends) before taking a call, before the call fails
MAX_UNTAKEN = 3
#: the directory of the runs' groups: each run has its own in it (a run's group 0 is not an earlier run's),
#: removed when the run ends (a killed run's, when the next one starts)
GROUPS_DIR = ".warm"


@dataclasses.dataclass(eq=False)
class _Group:
    shape: tuple
    directory: Path
    future: Any  # the group's MPI task
    jobs: itertools.count = dataclasses.field(default_factory=itertools.count)
    busy: bool = True
    idle_since: float = 0.0

    @property
    def alive(self) -> bool:
        return not self.future.done() and not Path(self.directory, STOP).exists()


def shape(call: StageCall) -> tuple:
    """What must be equal for two calls to share ranks: where and how they start (its resource
    specification: nodes, ranks, and ``min_nodes``: a group may start on fewer nodes)."""
    opts = call.opts
    own = (settings.RUN_DIR.name, settings.STAGE_DIR.name)  # each call's own, not the shape's
    env = tuple((k, v) for k, v in opts.env if k not in own)
    return call.executor, tuple(sorted(call.resources)), opts.launcher_args, opts.preflight, env, opts.import_path


class WarmGroups:
    """One workflow's groups. ``never_retry``: told each group's task id (a failed group is not run again)."""

    def __init__(self, run_dir: Path, placements: dict[str, Placement], never_retry: Any) -> None:
        self.never_retry = never_retry
        groups_dir = run_dir / GROUPS_DIR
        # what is there is runs' that were killed (the run lock lets one workflow at a time in)
        shutil.rmtree(groups_dir, ignore_errors=True)
        groups_dir.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="run-", dir=groups_dir))
        self.slots = {p.mpi_label: stages_at_once(p.site.spec) for p in placements.values()}
        self._groups: list[_Group] = []  # those that take calls
        self._started: list[_Group] = []  # every one, for the end
        self._made = itertools.count()
        self._apps: dict[bool, Any] = {}  # memoized or not -> the app
        self._cond = threading.Condition()
        self._closed = threading.Event()
        self.log = get_logger("parsl_torch.workflow")
        threading.Thread(target=self._stop_idle, daemon=True).start()

    def app(self, cache: bool):
        """This workflow's Parsl app of a warm stage (on the ``warm`` thread executor: nothing is pickled):
        its arguments are a cold stage's bash app's, so its identity is the same."""
        if cache not in self._apps:
            from parsl import python_app

            def warm_stage(call: StageCall, *args: Any, inputs: Sequence = (), outputs: Sequence = (),
                           **kwargs: Any) -> int:
                return self.run(call, args, kwargs, inputs, outputs)

            self._apps[cache] = python_app(warm_stage, executors=[WARM_LABEL], cache=cache)
        return self._apps[cache]

    def run(self, call: StageCall, args: tuple, kwargs: dict[str, Any], inputs: Sequence, outputs: Sequence) -> int:
        """One call in a group of its shape (one is started if none is free); raises as its bash app would."""
        from parsl.app.errors import BashExitFailure

        prepare_call(call, args, inputs, outputs, kwargs)
        for _ in range(MAX_UNTAKEN):
            group = self._take(call)
            try:
                outcome = self._call(group, call)
            finally:
                self._give_back(group)
            if outcome is not None:
                write_outcome(call.opts.stage_dir, outcome)
                raise BashExitFailure(call.stage, outcome.exit_code)
            if Path(call.opts.stage_dir, RESULT).exists():
                return 0
            # the group ended before it took the call (it stopped for its block's end): another group takes it
        write_outcome(call.opts.stage_dir, Outcome(Cause.LAUNCHER_FAILED, 1, f"{MAX_UNTAKEN} warm groups in a "
                                                   f"row stopped before they took the call"))
        raise BashExitFailure(call.stage, 1)

    def _take(self, call: StageCall) -> _Group:
        key = shape(call)
        with self._cond:
            while True:
                alive = [g for g in self._groups if g.shape == key and g.alive]
                free = next((g for g in alive if not g.busy), None)
                if free is not None:
                    free.busy = True
                    return free
                if len(alive) < self.slots.get(call.executor, 1):
                    group = self._start(key, call)
                    self._groups.append(group)
                    self._started.append(group)
                    return group
                self._cond.wait(1.0)

    def _give_back(self, group: _Group) -> None:
        with self._cond:
            group.busy, group.idle_since = False, time.monotonic()
            if not group.alive and group in self._groups:  # (close() may have taken it already)
                self._groups.remove(group)
            self._cond.notify_all()

    def _start(self, key: tuple, call: StageCall) -> _Group:
        directory = self.root / str(next(self._made))
        (directory / JOBS).mkdir(parents=True, exist_ok=True)
        env = {**call.opts.environment, settings.STAGE_DIR.name: str(directory)}
        group_opts = dataclasses.replace(call.opts, stage_dir=str(directory), walltime=None, env=tuple(env.items()),
                                         code="", code_roots=(), script=None, module=None, files=())
        serving = StageCall(group_opts, call.executor, call.resources, script=(sys.executable, "-m", WARM_RANK),
                            id="warm-group")
        future = bash_app_for(call.executor, cache=False)(
            serving, str(directory), stdout=str(directory / STDOUT), stderr=str(directory / STDERR),
            parsl_resource_specification=call.resource_specification)
        self.never_retry(future.tid)
        self.log.info("warm ranks: group %s starts (%d node(s) x %d rank(s))", directory.name,
                      group_opts.num_nodes, group_opts.ranks_per_node)
        return _Group(key, directory, future)

    def _call(self, group: _Group, call: StageCall) -> Outcome | None:
        """The call in ``group``: None when it is done (or was never taken), else why it failed."""
        opts = call.opts
        n = next(group.jobs)
        said = _size(group.directory / STDERR) if n else 0  # a new group's start lines are the call's
        stage_dir = Path(opts.stage_dir)
        started = time.monotonic()
        stagedir.write(job_path(group.directory, n), stagedir.WarmJob(str(stage_dir), opts.walltime))
        done, taken = job_path(group.directory, n, "done"), job_path(group.directory, n, "started")
        while not done.exists():
            if group.future.done() and not done.exists():
                if not taken.exists() and group.future.exception() is None:
                    return None  # it stopped (its block ends) before it took the call
                _pass_on(group, opts, said)
                return self._failure(group, opts, time.monotonic() - started)
            time.sleep(POLL_S)
        _pass_on(group, opts, said)
        told = done.read_text()
        return Outcome.from_dict(json.loads(told)) if told else None

    def _failure(self, group: _Group, opts: StageOptions, took: float) -> Outcome:
        """The group's end as the call's outcome."""
        if opts.walltime and took >= opts.walltime:
            return timed_out(opts.walltime)
        outcome = read_outcome(group.directory)
        if outcome is not None and outcome.cause is not Cause.OK:
            return outcome
        exc = group.future.exception()
        code = getattr(exc, "exitcode", 1)
        return Outcome(Cause.LAUNCHER_FAILED, code, f"its warm ranks ended: {exc or 'without a word'}")

    def _stop_idle(self) -> None:
        while not self._closed.wait(0.5):
            with self._cond:
                now = time.monotonic()
                for group in [g for g in self._groups if not g.busy]:
                    if not group.alive or now - group.idle_since > IDLE_S:
                        _ask_to_stop(group)
                        self._groups.remove(group)

    def close(self, wait: float = 30.0) -> None:
        """Stop every group; wait for their tasks (their nodes go back to the blocks), then remove
        the run's group directories (a failed group's lines are in its stage's stderr)."""
        self._closed.set()
        with self._cond:
            groups, self._groups = list(self._groups), []
        for group in groups:
            _ask_to_stop(group)
        deadline = time.monotonic() + wait
        for group in self._started:  # (those stopped when idle too)
            with contextlib.suppress(Exception):
                group.future.exception(timeout=max(deadline - time.monotonic(), 0.1))
        if all(group.future.done() for group in self._started):  # (ranks still up may still write there)
            shutil.rmtree(self.root, ignore_errors=True)


def _pass_on(group: _Group, opts: StageOptions, said: int) -> None:
    """The supervisor's lines since byte ``said`` of the group's stderr (a lost node, ranks started on
    fewer nodes, ...) go to the stage's stderr, where a cold stage has them."""
    with contextlib.suppress(OSError), open(group.directory / STDERR, errors="replace") as f:
        f.seek(said)
        lines = [line for line in f.read().splitlines() if line.startswith("parsl-torch:")]
        if lines:
            with open(Path(opts.stage_dir, STDERR), "a") as out:
                out.writelines(f"{line}\n" for line in lines)


def _ask_to_stop(group: _Group) -> None:
    with contextlib.suppress(OSError):
        write_atomic(Path(group.directory, STOP), "")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
