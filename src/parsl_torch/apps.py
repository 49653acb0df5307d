"""Distributed torch tasks as Parsl apps.

``@distributed_app`` turns a function into a stage that runs on every rank
after ``setup_torch()``: one Parsl bash app on the site's ``mpi`` executor,
whose command is::

    python -m parsl_torch.supervise --timeout T -- $PARSL_MPI_PREFIX \\
        python -m parsl_torch.shim -- python -m parsl_torch.stage_main PAYLOAD RESULT

(supervise: fail fast and leave nothing behind; the shim: torchrun variables
and failure reports; stage_main: set up torch, run the function, rank 0 keeps
its return value). The call returns a ``StageFuture``: it resolves to rank
0's return value or raises a ``StageError`` naming the stage, the failed rank,
its exit code and the tail of the stage's stderr; ``.outputs`` are the
stage's DataFutures for the next stage's ``inputs=``.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError, StageError

RESULT, PAYLOAD, STDOUT, STDERR = "result.pkl", "payload.pkl", "stdout.txt", "stderr.txt"
_TAIL_LINES = 25


@dataclass(frozen=True)
class ShippedFunction:
    """A stage's function, pickled where it was defined, with the globals it
    uses (a function from the workflow script travels by value)."""

    name: str
    blob: bytes

    @classmethod
    def of(cls, fn: Callable) -> ShippedFunction:
        import dill

        return cls(f"{fn.__module__}.{fn.__qualname__}", dill.dumps(fn, recurse=True))

    def load(self) -> Callable:
        import dill

        return dill.loads(self.blob)


@dataclass(frozen=True)
class StageFile:
    """What a stage's function receives for a Parsl ``File``: its path and URL.

    Unpickling a real ``File`` imports all of Parsl (and Globus Compute's SDK)
    on every rank, ~0.6 s of each stage's start; this travels without them.
    """

    filepath: str
    url: str

    def __fspath__(self) -> str:
        return self.filepath

    def __str__(self) -> str:
        return self.filepath

    @property
    def filename(self) -> str:
        return os.path.basename(self.filepath)


def plain_files(value: Any) -> Any:
    """``value`` with each Parsl File (also inside lists, tuples, dicts) as a StageFile."""
    from parsl.data_provider.files import File

    if isinstance(value, File):
        return StageFile(value.filepath, value.url)
    if isinstance(value, list) or type(value) is tuple:
        return type(value)(plain_files(v) for v in value)
    if isinstance(value, dict):
        return {k: plain_files(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class StageOptions:
    """How one call of a stage runs: carried to the worker with the call."""

    stage_dir: str
    num_nodes: int
    ranks_per_node: int
    walltime: float | None
    env: tuple[tuple[str, str], ...]
    launcher_args: tuple[str, ...]  # the site's binding flags, after $PARSL_MPI_PREFIX

    @property
    def num_ranks(self) -> int:
        return self.num_nodes * self.ranks_per_node


def _stage_command(fn: ShippedFunction | None, script: Sequence[str] | None, opts: StageOptions,
                   *args: Any, inputs: Sequence = (), outputs: Sequence = (), stdout: str | None = None,
                   stderr: str | None = None, parsl_resource_specification: dict | None = None,
                   **kwargs: Any) -> str:
    """Body of the Parsl bash app (runs on the worker): write the payload, return the command.

    ``stdout``, ``stderr`` and ``parsl_resource_specification`` are Parsl's:
    it reads them from the call (redirection, the MPI task's nodes)."""
    import os
    import shlex
    import sys

    py = shlex.quote(sys.executable)
    if fn is not None:
        import dill

        from parsl_torch.apps import accepted_kwargs, plain_files

        kwargs.update(accepted_kwargs(fn.load(), inputs=list(inputs), outputs=list(outputs)))
        args, kwargs = plain_files(args), plain_files(kwargs)
        payload = os.path.join(opts.stage_dir, "payload.pkl")
        result = os.path.join(opts.stage_dir, "result.pkl")
        if os.path.exists(result):
            os.unlink(result)  # a stale value must never pass for this run's
        with open(payload, "wb") as f:
            dill.dump((fn, args, kwargs), f)
        rank_cmd = f"{py} -m parsl_torch.stage_main {shlex.quote(payload)} {shlex.quote(result)}"
    else:
        rank_cmd = shlex.join([os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in script])
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in opts.env)
    timeout = f"--timeout {opts.walltime} " if opts.walltime else ""
    binding = shlex.join(opts.launcher_args)
    return (f"cd {shlex.quote(opts.stage_dir)} && {env} {py} -m parsl_torch.supervise {timeout}"
            f"--ranks {opts.num_ranks} -- $PARSL_MPI_PREFIX {binding} {py} -m parsl_torch.shim -- {rank_cmd}")


@functools.lru_cache(maxsize=1)
def _bash_app():
    from parsl import bash_app

    return bash_app(_stage_command, executors=["mpi"], cache=True, ignore_for_cache=["stdout", "stderr"])


def accepted_kwargs(fn: Callable, **candidates: Any) -> dict[str, Any]:
    """The candidates ``fn`` can take (by name, or through ``**kwargs``)."""
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    return {k: v for k, v in candidates.items() if takes_any or k in params}


class StageFuture(Future):
    """A stage's result, or a StageError; ``outputs`` are its DataFutures.

    ``result_file``: where rank 0's return value lands (None: the app's own
    result is the stage's, as for remote stages)."""

    def __init__(self, stage: str, app_future: Any, stderr: Path | None, result_file: Path | None) -> None:
        super().__init__()
        self.stage = stage
        self.app_future = app_future
        self.outputs = app_future.outputs
        self._stderr, self._result_file = stderr, result_file
        app_future.add_done_callback(self._finish)

    @property
    def from_cache(self) -> bool:
        return bool(self.app_future.task_record.get("from_memo"))

    def _finish(self, fut: Any) -> None:
        exc = fut.exception()
        if exc is not None:
            self.set_exception(exc if isinstance(exc, StageError) else stage_error(self.stage, exc, self._stderr))
            return
        if self._result_file is None:
            self.set_result(fut.result())
            return
        try:
            import dill

            with open(self._result_file, "rb") as f:
                self.set_result(dill.load(f))
        except FileNotFoundError:
            self.set_result(None)  # a script stage returns nothing
        except Exception as err:  # noqa: BLE001 - any unreadable result is the stage's failure
            self.set_exception(StageError(f"stage {self.stage!r} finished but its result "
                                          f"{self._result_file} cannot be read: {err}"))


def stderr_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def stage_error(stage: str, exc: BaseException, stderr: Path | None) -> StageError:
    """One error that says which stage, which rank, what exit code, and shows stderr's tail."""
    from parsl.app.errors import BashExitFailure
    from parsl.dataflow.errors import DependencyError

    if isinstance(exc, DependencyError):
        return StageError(f"stage {stage!r} did not run: a stage it depends on failed ({exc})")
    tail = stderr_tail(stderr) if stderr else ""
    ranks = re.findall(r"parsl-torch: (rank \d+ on \S+ (?:exited with code -?\d+|was killed by \w+))", tail)
    timed_out = re.search(r"parsl-torch: (timed out after [\d.]+ s)", tail)
    if isinstance(exc, BashExitFailure):
        what = ranks[0] if ranks else (timed_out.group(1) if timed_out else "a rank failed")
        head = f"stage {stage!r} failed: {what} (exit code {exc.exitcode})"
    else:
        head = f"stage {stage!r} failed: {type(exc).__name__}: {exc}"
    return StageError(f"{head}\n--- last lines of {stderr} ---\n{tail}" if tail else head)


class DistributedApp:
    """A stage: ``fn`` on every rank (``fn=None``: a script or module via ``script``)."""

    def __init__(self, fn: Callable | None, *, script: Sequence[str] | None = None, name: str | None = None,
                 num_nodes: int = 1, ranks_per_node: int | None = None, walltime: float | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.fn, self.script = fn, tuple(script) if script else None
        self.name = name or (fn.__name__ if fn else Path(self.script[-1]).stem)
        self.num_nodes, self.ranks_per_node = num_nodes, ranks_per_node
        self.walltime, self.env = walltime, dict(env or {})
        if fn is not None:
            functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, inputs: Sequence = (), outputs: Sequence = (), stage: str | None = None,
                 num_nodes: int | None = None, ranks_per_node: int | None = None,
                 walltime: float | None = None, **kwargs: Any) -> StageFuture:
        from .workflow import current_workflow

        wf = current_workflow(self.name)
        if wf.remote:
            raise ConfigError(f"stage {stage or self.name!r}: site {wf.site.name!r} runs stages through Globus "
                              f"Compute, where only the built-in stages run (train, evaluate: module entry "
                              f"points, no code shipped); run functions from a workflow script on a site "
                              f"with a shared file system")
        nodes = num_nodes or self.num_nodes
        ppn = ranks_per_node or self.ranks_per_node or wf.ranks_per_node
        wf.check_resources(stage or self.name, nodes, ppn)  # before anything is named or made
        check_inputs(stage or self.name, inputs)
        stage = wf.stage_name(stage or self.name)
        stage_dir = wf.run_dir / stage
        stage_dir.mkdir(parents=True, exist_ok=True)
        env = {"PARSL_TORCH_RUN_DIR": str(wf.run_dir), **self.env}
        opts = StageOptions(str(stage_dir), nodes, ppn, walltime or self.walltime, tuple(env.items()),
                            wf.launcher_args(ppn))
        outputs = [wf.place(o, stage_dir) for o in outputs]
        spec = {"num_nodes": nodes, "ranks_per_node": ppn, "num_ranks": nodes * ppn}
        shipped = ShippedFunction.of(self.fn) if self.fn is not None else None
        app_future = _bash_app()(shipped, self.script, opts, *args, inputs=list(inputs),
                                 outputs=outputs, stdout=str(stage_dir / STDOUT), stderr=str(stage_dir / STDERR),
                                 parsl_resource_specification=spec, **kwargs)
        future = StageFuture(stage, app_future, stage_dir / STDERR,
                             stage_dir / RESULT if self.fn is not None else None)
        wf.track(future, nodes * ppn)
        return future


def check_inputs(stage: str, inputs: Sequence) -> None:
    """Input files given directly (not futures of other stages) must exist now."""
    for item in inputs:
        path = getattr(item, "filepath", None) if not isinstance(item, Future) else None
        if path is not None and not Path(path).exists():
            raise ConfigError(f"stage {stage!r}: input file {path} does not exist")


def distributed_app(fn: Callable | None = None, *, name: str | None = None, num_nodes: int = 1,
                    ranks_per_node: int | None = None, walltime: float | None = None,
                    env: dict[str, str] | None = None):
    """Decorator: run ``fn`` on every rank of a Parsl MPI task, after ``setup_torch()``.

    ``name``: the stage name (default: the function's). ``num_nodes`` /
    ``ranks_per_node`` (default: the site's launch ranks per node) and
    ``walltime`` (seconds; every rank is stopped after it) can be given here
    and per call; ``env`` is exported to the ranks. Call it inside
    ``with pt.workflow(...)``; it returns a StageFuture.
    """

    def decorate(f: Callable) -> DistributedApp:
        return DistributedApp(f, name=name, num_nodes=num_nodes, ranks_per_node=ranks_per_node,
                              walltime=walltime, env=env)

    return decorate(fn) if fn is not None else decorate


def script_app(script: str | os.PathLike, *, module: bool = False, args: Sequence[Any] = (),
               num_nodes: int = 1, ranks_per_node: int | None = None, walltime: float | None = None,
               env: dict[str, str] | None = None, python: str | None = None) -> DistributedApp:
    """A stage that runs an existing script (or ``module=True``: ``python -m``) on every rank.

    Every rank gets the torchrun variables (an unmodified torchrun-style
    script works). Its future resolves to 0, the exit code; ``args`` may hold Files.
    """
    import sys

    py = python or sys.executable
    command = [py, "-m", str(script)] if module else [py, os.fspath(script)]
    name = str(script).rsplit(".", 1)[-1] if module else Path(script).stem
    return DistributedApp(None, script=[*command, *args], name=name, num_nodes=num_nodes,
                          ranks_per_node=ranks_per_node, walltime=walltime, env=env)



@functools.lru_cache(maxsize=1)
def _remote_app():
    from parsl import python_app

    from .remote import run_stage_on_endpoint

    return python_app(run_stage_on_endpoint, executors=["mpi"], cache=True)


def submit_builtin(kind: str, config: dict[str, Any], *, inputs: Sequence, outputs: Sequence,
                   input_roles: Sequence[str], output_roles: Sequence[str], app: DistributedApp,
                   stage: str | None = None, num_nodes: int | None = None, ranks_per_node: int | None = None,
                   walltime: float | None = None) -> StageFuture:
    """A built-in stage: a distributed app here, or on a Globus Compute site a
    module entry point on the endpoint (only its config travels)."""
    from .workflow import current_workflow

    wf = current_workflow(stage or kind)
    if not wf.remote:
        return app(config, inputs=list(inputs), outputs=list(outputs), stage=stage, num_nodes=num_nodes,
                   ranks_per_node=ranks_per_node, walltime=walltime)
    nodes, ppn = num_nodes or 1, ranks_per_node or wf.ranks_per_node
    wf.check_resources(stage or kind, nodes, ppn)
    name = wf.stage_name(stage or kind)
    g = wf.site.spec.globus
    remote_dir = f"{g.remote_run_dir.rstrip('/')}/{wf.run_dir.name}/{name}"
    outputs = [wf.place(o, Path(remote_dir)) for o in outputs]
    spec = {"num_nodes": nodes, "ranks_per_node": ppn, "num_ranks": nodes * ppn}
    app_future = _remote_app()(kind, config, g.python, walltime, tuple(input_roles), tuple(output_roles),
                               inputs=list(inputs), outputs=outputs, parsl_resource_specification=spec)
    future = StageFuture(name, app_future, None, None)
    wf.track(future, nodes * ppn)
    return future
