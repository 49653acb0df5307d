"""``with pt.workflow(site=..., run_dir=...)``: the Parsl side of a run.

Loads the site's ``parsl.Config`` with memoization and checkpointing under
``<run_dir>/parsl``, so rerunning a workflow with the same run directory
skips the stages that finished (``fresh=True`` starts over). Stage calls
inside the block find the workflow here, get their own directory
``<run_dir>/<stage>`` (relative output Files land there), and report their
progress as they go. Leaving the block waits for every stage.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ... import parslext, sites
from ...observe import native as preload
from ...common import settings, stagedir
from ...common.diskspace import NO_SPACE, free_text
from ...common.runlock import RunLock
from ...core.log import get_logger, said_once_when_unwritable
from ...core.snapshot import forget as forget_kept_states
from ...errors import ConfigError
from ...launch.leanparsl import parsl_for_a_workflow
from .. import identity
from . import status, watchdog
from ..stage.continuation import DEFAULT_MAX_CONTINUATIONS, Continuations
from .signals import Terminated, how_it_ended, terminate_cleanly
from .placement import Placement, check_file_name, placements
from .request import WorkflowRequest, sites_checked
from .rundir import check_ours, check_stage_name, prepare
from .status import StatusFile
from ..stage.settle import Settler
from ..identity.usercode import rank_import_path
from ..warm.groups import WarmGroups

_current: contextvars.ContextVar[Workflow | None] = contextvars.ContextVar("parsl_torch_workflow", default=None)


def current_workflow(stage: str) -> Workflow:
    wf = _current.get()
    if wf is None:
        raise ConfigError(f"stage {stage!r} was called outside a workflow: call it inside "
                          f"`with pt.workflow(site=..., run_dir=...):`")
    return wf


class Workflow:
    """The run in progress: its site, directory, stage names and progress."""

    def __init__(self, where: dict[str, Placement], run_dir: Path, memoize: bool = True,
                 max_continuations: int = DEFAULT_MAX_CONTINUATIONS, retry_handler: Any = None) -> None:
        #: the workflow's sites (the first is the default), each with its executor's label
        self.where = where
        self.home = next(iter(where.values()))
        self.site = self.home.site
        self.run_dir = run_dir
        #: False in a Parsl config of the user's own, where stages always run (that config's memoizer
        #: cannot know a stage's directory)
        self.memoize = memoize
        self.secrets: set[str] = set()  # the string arguments of its stages named as secrets (``stage_error``)
        self._futures: list[Any] = []
        self._submitted: dict[str, float] = {}
        #: file digests and parsed modules, shared by the stage calls and the memoizer
        self.digests = identity.DigestCache.of_run_dir(run_dir)
        #: set when the workflow script raised: no stage starts after it (the memoizer refuses them)
        self.stopping = threading.Event()
        self.status = StatusFile(run_dir, self.site.name)
        #: Parsl's retry_handler: a stage that stopped for its block's end is submitted again
        self.continuations = Continuations(self.status, max_continuations, retry_handler)
        #: each output DataFuture of a stage called so far -> (it, the stage, where it runs)
        self.made_on: dict[int, tuple[Any, str, Placement]] = {}
        #: with warm=True: the groups of ranks that run the function stages (``apps.warm``)
        self.warm: WarmGroups | None = None
        #: on the sites' own Parsl: ends a stage whose supervisor's outcome Parsl cannot answer (``apps.stage.settle``)
        self.settler: Settler | None = None
        self._names: Counter[str] = Counter()
        self._taken: set[str] = set()
        self._lock = threading.Lock()
        self.log = get_logger("parsl_torch.workflow")

    def placement(self, stage: str, site: str | None) -> Placement:
        """Where a stage called with ``site=`` runs (None: the workflow's default site)."""
        if site is None:
            return self.home
        if site not in self.where:
            raise ConfigError(f"stage {stage!r}: site={site!r} is not one of this workflow's sites "
                              f"({', '.join(self.where)}): add it to pt.workflow(sites=[...])")
        return self.where[site]

    def stage_name(self, base: str, explicit: bool = False) -> str:
        """A name no other stage of this run has: ``base``, then ``base-1``, ``base-2``... in
        call order (the same on every rerun). An explicit name (``stage=``) already taken is an
        error: two stages would share one directory and overwrite each other's files."""
        check_stage_name(base, explicit)
        with self._lock:
            if explicit:
                if base in self._taken:
                    raise ConfigError(f"stage name {base!r} is already used in this workflow: give each "
                                      f"call its own stage= (or leave it out for {base}-1, {base}-2, ...)")
                self._taken.add(base)
                return base
            n = self._names[base]
            while (name := base if n == 0 else f"{base}-{n}") in self._taken:
                n += 1
            self._names[base] = n + 1
            self._taken.add(name)
            return name

    def release_name(self, name: str) -> None:
        """``name``'s call ended and it is called again, the same call (a sweep's promoted trial): its name is
        free for it."""
        with self._lock:
            self._taken.discard(name)

    def place(self, item: Any, stage_dir: Path) -> Any:
        """An output File (or path) with a relative name moved into the stage's directory. An output
        is the stage's own: a name that leaves its directory (``../x``), or an absolute path into
        another part of the run directory, would overwrite another stage's files."""
        from parsl.data_provider.files import File

        file = item if isinstance(item, File) else File(os.fspath(item))
        check_file_name(stage_dir.name, "output", file)
        if file.scheme != "file":
            return file
        path = Path(os.path.normpath(stage_dir / file.filepath))  # (an absolute filepath stays itself)
        inside = path.is_relative_to(stage_dir) and path != stage_dir
        if not inside and (not os.path.isabs(file.filepath) or path.is_relative_to(self.run_dir)):
            raise ConfigError(f"stage {stage_dir.name!r}: output {file.filepath!r} is not inside the stage's "
                              f"directory {stage_dir}: name it by a path inside it ('model.pt', 'ckpt/model.pt'), "
                              f"or by an absolute path outside the run directory (a stage's files never "
                              f"overwrite another's)")
        return File(str(path)) if not os.path.isabs(file.filepath) else file

    def running(self) -> list[Any]:
        """The stages that are running now (started since they were submitted, not done)."""
        return [f for f in self._futures if not f.done() and self._started(f.stage) >= self._submitted[f.stage]]

    @contextlib.contextmanager
    def running_stages_finish(self, on_error: str) -> Iterator[None]:
        """The workflow script's body: if it raises, say so at once and (on_error="wait") let the
        stages that are running finish before Parsl is shut down; Ctrl-C during that wait stops them."""
        try:
            yield
        except BaseException as exc:
            self.stopping.set()
            running = self.running() if on_error == "wait" and not isinstance(exc, (KeyboardInterrupt, Terminated)) \
                else []
            first = (str(exc).splitlines() or [""])[0]
            self.log.error("the workflow script raised %s%s%s", type(exc).__name__, f": {first}" if first else "",
                           f"; waiting for the running stage(s) {', '.join(f.stage for f in running)} to finish "
                           f"(pt.workflow(on_error='cancel') stops them at once; Ctrl-C stops them now)"
                           if running else "")
            with contextlib.suppress(KeyboardInterrupt):
                for future in running:
                    with contextlib.suppress(Exception):
                        future.exception()
            raise

    def wait(self) -> None:
        """Wait for every stage of this workflow (not the other tasks of the user's Parsl)."""
        for future in list(self._futures):
            with contextlib.suppress(Exception):
                future.exception()

    def _ran_for(self, stage: str, submitted: float) -> float:
        """Seconds since the stage's last attempt started (not since it was submitted: it may have
        waited for the stages it depends on, and for a slot)."""
        return time.time() - max(submitted, self._started(stage))

    def _started(self, stage: str) -> float:
        """When the stage's last attempt started (-inf: none has)."""
        with contextlib.suppress(OSError):
            return (self.run_dir / stage / stagedir.STARTED).stat().st_mtime
        return -math.inf

    def stages_of(self, values: Iterable[Any]) -> list[str]:
        """The stages whose results or files among ``values`` a call waits for (``outputs[i]``, a stage's future)."""
        found = [self.made_on[id(v)][1] if id(v) in self.made_on else getattr(v, "stage", None)
                 for v in values if isinstance(v, Future)]
        return list(dict.fromkeys(s for s in found if s))

    def track(self, future: Any, ranks: int, where: Placement | None = None, waits_for: Sequence[str] = ()) -> None:
        self._futures.append(future)
        for output in future.outputs:
            self.made_on[id(output)] = (output, future.stage, where or self.home)
        self._submitted[future.stage] = submitted = time.time() - 1.0  # mtimes may be coarser than time()
        self.continuations.watch(future.app_future.tid, future.stage, self.run_dir / future.stage)
        # (debug: a stage that is skipped says so, one that runs says why, when it is ready)
        self.log.debug("[%s] submitted: %d rank(s)", future.stage, ranks)
        self.status.stage(future.stage, state="waiting", submitted_at=submitted, ranks=ranks,
                          waits_for=list(waits_for))

        def done(f: Any) -> None:
            took = self._ran_for(f.stage, submitted)
            if f.exception() is not None:
                line = str(f.exception()).splitlines()[0]
                self.log.error("[%s] FAILED after %.1f s: %s", f.stage, took, line)
                self.status.stage(f.stage, state="failed", error=line)
            elif f.from_cache:
                self.log.info("[%s] skipped: finished in an earlier run of %s", f.stage, self.run_dir)
                self.status.skipped(f.stage, result=status.result_metrics(f.result()))
            else:
                since = time.time() - submitted - 1.0
                waited = f" ({since:.1f} s after it was submitted)" \
                    if since - took > 1.0 else ""
                self.log.info("[%s] done in %.1f s%s", f.stage, took, waited)
                self.status.stage(f.stage, state="done", seconds=round(took, 1),
                                  result=status.result_metrics(f.result()))

        future.add_done_callback(done)


@contextlib.contextmanager
def workflow(site: str = "auto", run_dir: str | os.PathLike = "runs/default", *, fresh: bool = False,
             retries: int = 0, max_continuations: int = DEFAULT_MAX_CONTINUATIONS, on_error: str = "wait",
             gc_executor: Any = None, **keywords: Any) -> Iterator[Workflow]:
    """Run stages on ``site`` with their files and Parsl's records under ``run_dir``.

    ``retries``: times Parsl reruns a failed stage (the built-in train stage resumes from its last checkpoint). A
    stage that stops for its block's end (``walltime``) is submitted again without using them, until it ends
    ``max_continuations`` blocks in a row without progress. Other keywords are site overrides (account, queue,
    walltime, nodes, as for ``pt.sites.load``) or ``parsl.Config`` settings (``monitoring=MonitoringHub(...)``,
    ``retry_handler``, ``max_idletime``, ...). ``sites=[default, *others]`` instead of ``site``: stages called with
    ``site=`` run on another of them (``placement``: their inputs must be on a file system that site sees).
    ``on_error``: when the workflow script raises, the error is logged at once and the stages already running finish
    ("wait", the default: their work is kept and a rerun skips them) or are stopped at once ("cancel"); stages that
    have not started never start. On a Globus Compute site the stages write under the site's
    ``remote_run_dir``/<run_dir name>; Parsl's records stay here. ``gc_executor`` replaces the site's Globus Compute
    Executor (tests). ``warm=True``: function stages of one shape run one after another in ranks that are already up
    (``apps.warm``; script stages run cold). Under ``parsl-torch run --site S --run-dir D --fresh`` those flags
    replace what the script passes (the log says so).
    """
    settings.check_user_settings()  # (read on the ranks too late: a bad one would fail every stage, minutes in)
    parsl_for_a_workflow()
    parslext.check()  # (a Parsl that moved what parsl-torch patches: named now, not a task that never ends)
    request = WorkflowRequest.of(site, run_dir, fresh, retries, max_continuations, on_error, gc_executor, keywords)
    loaded, others, users_dfk = sites_checked(request)
    run_dir = _made_run_dir(request.run_dir)
    with RunLock(run_dir):  # a second workflow on this directory fails here, naming this one
        prepare(run_dir, request.fresh)
        wf = _made(request, loaded, others, users_dfk, run_dir)
        with _current_while(wf, request), terminate_cleanly(), _stages_run(wf, request, users_dfk):
            yield wf


def _made(request: WorkflowRequest, loaded: Any, others: list, users_dfk: bool, run_dir: Path) -> Workflow:
    """The workflow, its start logged (its sites, its run directory, the flags ``parsl-torch run`` replaced)."""
    from ..identity.memo import register_memo_ids  # (with Parsl: not where the ranks import this module)

    register_memo_ids()
    wf = Workflow(placements(loaded, others, users_dfk), run_dir, memoize=not users_dfk,
                  max_continuations=request.max_continuations, retry_handler=request.retry_handler)
    wf.log.info("workflow on site %r%s, run directory %s%s", loaded.name,
                f" (and {', '.join(o.name for o in others)})" if others else "", run_dir,
                " (in your own Parsl config: stages always run)" if users_dfk else "")
    for key, asked in request.given.items():
        wf.log.info("%s %s from parsl-torch run --%s (the script asked for %s)", key.replace("_", " "),
                    getattr(request, key), key.replace("_", "-"), asked)
    if not users_dfk and preload.library() is None:  # (built here once: the ranks find it in the cache)
        wf.log.warning("%s: what stages read through compiled code is not observed (safetensors, pyarrow, a tool "
                       "they run: a file read only that way can change unseen, and its stage is skipped); a shell "
                       "script or binary stage reruns every time (parsl-torch doctor)", preload.why_not())
    return wf


@contextlib.contextmanager
def _current_while(wf: Workflow, request: WorkflowRequest) -> Iterator[None]:
    """The script's block: ``wf`` is the current workflow, progress lines are printed, and how it ended
    goes into ``status.json``."""
    token = _current.set(wf)
    watching = status.Progress(wf.run_dir, request.progress, settings.PROGRESS_EVERY.get())
    ended = None
    try:
        yield
    except BaseException as exc:
        ended = how_it_ended(exc)
        raise
    finally:
        wf.status.finish(ended)
        watching.stop()
        _current.reset(token)
        forget_kept_states(wf.run_dir)  # (the stages' states in this node's memory: no retry can come now)


@contextlib.contextmanager
def _stages_run(wf: Workflow, request: WorkflowRequest, users_dfk: bool) -> Iterator[None]:
    """The script's block, while its stages run (on your own Parsl, or on Parsl loaded with the sites and
    the warm groups); when it ends, so have they: the stages, then the warm groups, then Parsl's other tasks."""
    if users_dfk:
        with wf.running_stages_finish(request.on_error):
            yield
        wf.wait()
        return
    with _parsl_loaded(wf, request) as dfk, Settler(dfk.executors, wf.log) as wf.settler:
        with contextlib.closing(WarmGroups(wf.run_dir, wf.where, wf.continuations.never)) if request.warm else \
                contextlib.nullcontext() as wf.warm:
            with wf.running_stages_finish(request.on_error):
                yield
            wf.wait()
        dfk.wait_for_current_tasks()


def _made_run_dir(run_dir: str) -> Path:
    """The run directory, made, as its real path: reached through a link or ``..`` it is the same
    directory, and its stages the same stages."""
    path = Path(run_dir).absolute()
    check_ours(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create run directory {path}: {exc.strerror}: pick another --run-dir") from None
    return path.resolve()


@contextlib.contextmanager
def _parsl_loaded(wf: Workflow, request: WorkflowRequest) -> Iterator[Any]:
    """Parsl loaded with the sites' executors, the memoizer and checkpoints under ``<run_dir>/parsl``;
    what it starts ends with this process; its log leaves out the tasks' arguments."""
    import parsl
    from parsl.utils import get_all_checkpoints

    from ..identity.memo import StageMemoizer  # (Parsl's subclass: imported where Parsl is)

    parsl_dir = wf.run_dir / "parsl"
    memoizer = StageMemoizer(get_all_checkpoints(str(parsl_dir)), wf.digests, wf.stopping)
    config = sites.build.workflow_config([w.site.spec for w in wf.where.values()], str(parsl_dir),
                                         request.gc_executor, warm=request.warm, import_path=rank_import_path(),
                                         memoizer=memoizer, retries=request.retries,
                                         retry_handler=wf.continuations, **request.config_settings)
    parsl_log: list = []
    with _everything_ends_with_this_process():
        try:
            with _parsl_started(parsl, config, parsl_dir) as dfk:
                parsl_log = _file_handlers("parsl", parsl_dir)
                for handler in parsl_log:
                    handler.addFilter(_without_task_arguments)
                    said_once_when_unwritable(handler, wf.log)
                yield dfk
        finally:
            for handler in parsl_log or _file_handlers("parsl", parsl_dir):  # (a start that failed left it on)
                logging.getLogger("parsl").removeHandler(handler)  # Parsl detaches it but leaves the file open:
                with contextlib.suppress(OSError):                 # one fd more per workflow in a notebook
                    handler.close()                                # (a full disk: its last records are lost)


def _parsl_started(parsl: Any, config: Any, parsl_dir: Path) -> Any:
    """Parsl loaded; a disk too full for its start (its certificates, its logs) refused as such."""
    try:
        return parsl.load(config)
    except OSError as exc:
        if exc.errno in NO_SPACE:
            raise ConfigError(f"cannot start Parsl in {parsl_dir} ({exc.strerror}; {free_text(parsl_dir)}): free "
                              f"space there (or have the quota raised) or pick another --run-dir") from None
        raise


@contextlib.contextmanager
def _everything_ends_with_this_process() -> Iterator[None]:
    """What Parsl starts from here (interchange, local worker pools, stages) carries a token
    that a watchdog process kills when this process ends, however it ends."""
    import secrets

    token = secrets.token_hex(12)
    dog = watchdog.start(token)
    # Parsl's interchange and pools retitle themselves (setproctitle), which overwrites their
    # environment and so the token, unless setproctitle is told to keep it: then every process
    # started from here carries the token from its first instant, whatever instant this one dies
    given = {name: os.environ.get(name) for name in (settings.WORKFLOW.name, settings.KEEP_ENVIRON.name)}
    os.environ.update({settings.WORKFLOW.name: token, settings.KEEP_ENVIRON.name: "1"})
    try:
        yield
    finally:
        for name, value in given.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        watchdog.stop(dog)


def _without_task_arguments(record: Any) -> bool:
    """Parsl's HTEX logs each task's arguments at DEBUG (100 characters of each): a stage's
    arguments may hold secrets (an API key in a config dict), so parsl.log gets the line without."""
    if record.name.startswith("parsl.executors") and " with args " in str(record.msg):
        record.msg = str(record.msg).split(" with args ", 1)[0] + " with args (not logged: they may hold secrets)"
    return True


def _file_handlers(logger: str, under: Path) -> list:
    return [h for h in logging.getLogger(logger).handlers
            if isinstance(h, logging.FileHandler) and Path(h.baseFilename).is_relative_to(under)]
