"""Distributed torch tasks as Parsl apps.

``@distributed_app`` turns a function into a stage that runs on every rank
after ``setup_torch()``: one Parsl bash app on the site's ``mpi`` executor,
whose command is::

    python -m parsl_torch.launch.supervise --timeout T -- $PARSL_MPI_PREFIX \\
        python -m parsl_torch.launch.shim -- python -m parsl_torch.apps.stage.main PAYLOAD RESULT

(supervise: fail fast and leave nothing behind; the shim: torchrun variables
and failure reports; stage_main: set up torch, run the function, rank 0 keeps
its return value). The call returns a ``StageFuture`` (``futures``).
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path, PurePath
from typing import Any

from ...common import settings
from ...common.metadata import argument_secrets
from ...observe.native import python_program
from ...common.records import ENV_NAME
from ...common.stagedir import RESULT, STDERR, STDOUT
from ...errors import ConfigError
from ...launch.packing import MIN_NODES_KEY
from .call import StageCall
from ..identity.fingerprint import Fingerprinter, Unidentifiable
from .futures import StageFuture
from .options import ShippedFunction, StageOptions
from ..session.placement import Placement
from ..remote.client import RemoteAnswer, remote_job, submit_remote
from ..session.request import BuiltinCall
from .scriptargs import check_script_argument, runs_python, script_command_length, script_stage_name, script_word
from .cold import bash_app_for
from ..identity.usercode import rank_import_path
from ..session.workflow import Workflow, current_workflow


#: the keywords a stage's call takes for itself (``inputs``/``outputs`` are also passed to a function that takes them)
STAGE_OPTIONS = {"stage": "the stage's name", "num_nodes": "its nodes", "ranks_per_node": "its ranks per node",
                 "walltime": "its time limit", "env": "its ranks' environment variables", "site": "the site it runs on",
                 "min_nodes": "the fewest nodes it may start on"}


class DistributedApp:
    """A stage: ``fn`` on every rank (``fn=None``: a script or module via ``script``).

    ``files``: files and directories the stage reads besides ``inputs=`` (a script's
    arguments, a built-in stage's data file), part of its identity."""

    def __init__(self, fn: Callable | None, *, script: Sequence[str] | None = None, name: str | None = None,
                 num_nodes: int = 1, ranks_per_node: int | None = None, walltime: float | None = None,
                 env: dict[str, str] | None = None, files: Sequence[str] = (), python: str | None = None,
                 min_nodes: int | None = None, check: Callable[[int, int, bool], None] | None = None) -> None:
        self.fn, self.script = fn, tuple(script) if script else None
        self.check = check  # (world, ranks per node, CPUs only): what of its arguments needs the call's ranks
        self.python = python  # a script's Python as given (None: the one the stage runs under)
        self.name = name or fn.__name__  # a script's name is given by script_app
        self.num_nodes, self.ranks_per_node, self.min_nodes = num_nodes, ranks_per_node, min_nodes
        self.walltime, self.env = walltime, dict(env or {})
        self.files = tuple(files)
        #: the stage options that are also parameters of ``fn``: a call's keyword would reach only the stage
        self.shadowed = tuple(o for o in STAGE_OPTIONS if o in _keyword_names(fn)) if fn is not None else ()
        if fn is not None:
            functools.update_wrapper(self, fn)

    def reading(self, files: Sequence[str], check: Callable[[int, int, bool], None] | None = None) -> DistributedApp:
        """This stage, also identified by the content of ``files``; ``check(world, ranks_per_node)`` raises
        at the call what its arguments cannot do on its ranks."""
        return DistributedApp(self.fn, script=self.script, name=self.name, num_nodes=self.num_nodes,
                              ranks_per_node=self.ranks_per_node, walltime=self.walltime, env=self.env,
                              files=(*self.files, *files), python=self.python, min_nodes=self.min_nodes,
                              check=check or self.check)

    def __call__(self, *args: Any, inputs: Sequence = (), outputs: Sequence = (), stage: str | None = None,
                 num_nodes: int | None = None, ranks_per_node: int | None = None, walltime: float | None = None,
                 env: dict[str, str] | None = None, site: str | None = None, min_nodes: int | None = None,
                 **kwargs: Any) -> StageFuture:
        wf = current_workflow(self.name)
        asked = stage or self.name
        if self.shadowed:
            self._refuse_shadowed(asked, {"stage": stage, "num_nodes": num_nodes, "ranks_per_node": ranks_per_node,
                                          "walltime": walltime, "env": env, "site": site, "min_nodes": min_nodes})
        placement = wf.placement(asked, site)
        nodes = num_nodes or self.num_nodes
        ppn = ranks_per_node or self.ranks_per_node or placement.ranks_per_node
        walltime = check_walltime(asked, walltime if walltime is not None else self.walltime)
        stage_env = {**self.env, **(env or {})}  # per call over the decorator's
        check_env(asked, stage_env)
        placement.check_resources(asked, nodes, ppn)  # before anything is named or made
        self._check_world(asked, nodes, ppn, placement.site.cpus_only)
        min_nodes = min_nodes if min_nodes is not None else self.min_nodes
        placement.check_min_nodes(asked, min_nodes, nodes)
        if not placement.remote:  # (on an endpoint, paths name the endpoint's files: they are read there)
            # a Path argument names a file where the workflow runs; the ranks start in the stage's directory
            args = tuple(_absolute(a) for a in args)
            kwargs = {k: _absolute(v) for k, v in kwargs.items()}
            inputs = [_input_file(i) for i in inputs]
        placement.check_inputs(asked, list(inputs), wf.made_on)
        if self.script is not None:
            self._check_script_call(asked, args, kwargs)
        self._check_arguments(asked, args, kwargs)
        if self.fn is not None:  # kept out of every stage error of the workflow (``StageFuture``)
            wf.secrets.update(argument_secrets(self.fn, args, kwargs))
        name = wf.stage_name(asked, explicit=stage is not None)
        stage_dir = placement.stage_dir(wf.run_dir, name)
        script = self._command_line(stage_dir, outputs)
        if script is not None and not placement.remote:
            args = tuple(script_word(a, outputs, stage_dir) for a in args)
        call = self._call(wf, placement, stage_dir, nodes, ppn, walltime, stage_env, min_nodes, script)
        outputs = [wf.place(o, stage_dir) for o in outputs]
        if placement.remote:
            future = _remote(wf, call, self.fn, self.python, args, kwargs, list(inputs), outputs)
        elif wf.warm is not None and self.fn is not None:  # (a script owns its process: it runs cold)
            future = _warm(wf, call, args, kwargs, list(inputs), outputs)
        else:
            future = _cold(wf, call, args, kwargs, list(inputs), outputs)
        wf.track(future, nodes * ppn, placement, wf.stages_of([*inputs, *args, *kwargs.values()]))
        return future

    def _command_line(self, stage_dir: Path, outputs: Sequence) -> tuple[str, ...] | None:
        """A script stage's command line for this call (None for a function): ``args`` that name files
        where the workflow runs made absolute, those that name the call's outputs in ``stage_dir``."""
        if self.script is None:
            return None
        command = script_command_length(self.script)
        return (*self.script[:command], *(script_word(a, outputs, stage_dir) for a in self.script[command:]))

    def _refuse_shadowed(self, stage: str, options: dict[str, Any]) -> None:
        """A stage option given by keyword that is also a parameter of the function: it would silently reach
        only the stage, and the function would run with its default."""
        if given := [o for o in self.shadowed if options[o] is not None]:
            raise ConfigError(f"stage {stage!r}: {given[0]}= is the stage's option ({STAGE_OPTIONS[given[0]]}), and "
                              f"{self.name}() has a parameter {given[0]!r} too, which would not get it: rename "
                              f"that parameter (e.g. {given[0]}_), or pass its value positionally")

    def _check_script_call(self, stage: str, args: tuple, kwargs: dict[str, Any]) -> None:
        """A script takes its call's positional arguments on its command line; keywords have no place there."""
        if kwargs:
            raise ConfigError(f"stage {stage!r}: {', '.join(map(repr, kwargs))}: a script stage takes no keyword "
                              f"arguments but its own (inputs, outputs, {', '.join(STAGE_OPTIONS)}): pass the "
                              f"script's options positionally, e.g. "
                              f"app('--{next(iter(kwargs)).replace('_', '-')}', value), or in script_app(args=[...])")
        for arg in args:
            check_script_argument(arg, f"stage {stage!r}")

    def _call(self, wf: Workflow, placement: Placement, stage_dir: Path, nodes: int, ppn: int, walltime: float | None,
              stage_env: dict[str, str], min_nodes: int | None, script: tuple[str, ...] | None) -> StageCall:
        """The call's record: its options (code identity read now), its function, where it runs."""
        # (the site's environment reaches the ranks through the workers too: given here, it is compared)
        env = {settings.RUN_DIR.name: str(stage_dir.parent), settings.STAGE_DIR.name: str(stage_dir),
               **placement.site.spec.environment, **placement.site.rank_env(), **stage_env}
        target, module = _script_target(script)
        opts = StageOptions(str(stage_dir), nodes, ppn, walltime, tuple(env.items()), placement.site.launcher_args(ppn),
                            **self._code(stage_dir.name), script=target, module=module,
                            site_setup=placement.site.spec.provider.worker_init,
                            accelerated=placement.site.accelerated,
                            import_path=rank_import_path(),
                            preflight=placement.site.spec.mpi.preflight)
        resources = {"num_nodes": nodes, "ranks_per_node": ppn, "num_ranks": nodes * ppn}
        if min_nodes is not None and min_nodes < nodes:  # the pool may start it on fewer (launch.pool)
            resources[MIN_NODES_KEY] = min_nodes
        # (a remote stage's function is shipped with its job: remote.client)
        fn = ShippedFunction.of(self.fn) if self.fn is not None and not placement.remote else None
        # (no verdict of ours in your own Parsl config: the worker identifies the call; a remote one's task decides)
        return StageCall(opts, placement.mpi_label, tuple(resources.items()), fn, script or (),
                         identify_on_worker=not wf.memoize and not placement.remote)

    def _check_world(self, stage: str, nodes: int, ppn: int, cpus_only: bool) -> None:
        """What of its arguments needs the call's ranks and their nodes (``reading(check=)``), refused at the
        call."""
        if self.check is not None:
            try:
                self.check(nodes * ppn, ppn, cpus_only)
            except ConfigError as exc:
                raise ConfigError(f"stage {stage!r} on {nodes} node(s) x {ppn} rank(s): {exc}") from None

    def _check_arguments(self, stage: str, args: tuple, kwargs: dict[str, Any]) -> None:
        """Arguments that are not futures need an identity now, so one without fails before anything
        is submitted (the files they name are read when the stage is ready to run)."""
        names = _parameter_names(self.fn, len(args)) if self.fn is not None else []
        fp = Fingerprinter(strict=True)
        try:
            labels = [*names, *range(len(names) + 1, len(args) + 1), *kwargs]  # (a name, else its position)
            for label, value in zip(labels, (*args, *kwargs.values())):
                if not isinstance(value, Future):
                    fp.token(value, f"argument {label!r}")
        except Unidentifiable as exc:
            raise ConfigError(f"stage {stage!r}: {exc}") from None

    def _code(self, stage: str) -> dict[str, Any]:
        """The ``StageOptions`` fields of the function's identity, read now: its fingerprint, the user
        modules it reaches, the files it is told about (its ``files=``, Path values among its globals) and
        the installed modules it uses (a script's are read from its file when it is called)."""
        if self.fn is None:
            return {"files": self.files}
        fp = Fingerprinter(strict=False, state_apart=True)
        return {"code": fp.digest(self.fn, f"stage {stage!r}"), "code_roots": tuple(sorted(fp.roots)),
                "files": (*self.files, *sorted(fp.files)), "packages": tuple(sorted(fp.packages)),
                "state": tuple(sorted(fp.state.items()))}


def _cold(wf: Workflow, call: StageCall, args: tuple, kwargs: dict[str, Any], inputs: list,
          outputs: list) -> StageFuture:
    """A stage whose ranks start for this call: an MPI task on the site's executor (``stage.cold``)."""
    stage_dir = Path(call.opts.stage_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    app_future = bash_app_for(call.executor, wf.memoize)(
        call, *args, inputs=inputs, outputs=outputs, stdout=str(stage_dir / STDOUT), stderr=str(stage_dir / STDERR),
        parsl_resource_specification=call.resource_specification, **kwargs)
    if wf.settler is not None:
        wf.settler.watch(app_future, stage_dir)
    return StageFuture(call.stage, app_future, stage_dir / STDERR, stage_dir / RESULT if call.returns else None,
                       secrets=wf.secrets)


def _warm(wf: Workflow, call: StageCall, args: tuple, kwargs: dict[str, Any], inputs: list,
          outputs: list) -> StageFuture:
    """A function stage in ranks already up (``warm``)."""
    stage_dir = Path(call.opts.stage_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    app_future = wf.warm.app(wf.memoize)(call, *args, inputs=inputs, outputs=outputs, **kwargs)
    return StageFuture(call.stage, app_future, stage_dir / STDERR, stage_dir / RESULT, secrets=wf.secrets)


def _remote(wf: Workflow, call: StageCall, fn: Callable | None, python: str | None, args: tuple,
            kwargs: dict[str, Any], inputs: list, outputs: list) -> StageFuture:
    """A stage on a Globus Compute endpoint: one task there (``remote.client``, ``remote.job``); ``fn``
    is shipped with the job, ``python`` is a script's there."""
    job = remote_job(call, fn, python, wf.digests, wf.memoize)
    return StageFuture(call.stage, submit_remote(wf, job, args, kwargs, inputs, outputs), None, None,
                       answer=RemoteAnswer.unwrapped)


def _absolute(value: Any) -> Any:
    return type(value)(os.path.abspath(value)) if isinstance(value, PurePath) else value


def _input_file(value: Any) -> Any:
    """A file named in ``inputs=`` by a string or a Path, as the Parsl File of its absolute path: checked to
    exist and compared by content as a File is (a relative name meant the caller's, where the ranks, which
    start in the stage's directory, did not find it)."""
    from parsl.data_provider.files import File

    if isinstance(value, PurePath) or (isinstance(value, str) and "://" not in value):
        return File(os.path.abspath(value))
    return value


def _parameters(fn: Callable) -> list[Any]:
    """The ``inspect.Parameter``s of ``fn`` (none where it has no signature Python can read)."""
    import inspect

    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []


def _keyword_names(fn: Callable) -> set[str]:
    """The parameters of ``fn`` that a call can give by keyword."""
    return {p.name for p in _parameters(fn) if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _parameter_names(fn: Callable, n: int) -> list[str]:
    return [p.name for p in _parameters(fn) if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:n]


def _script_head(script: str | os.PathLike, module: bool, python: str | None) -> list[str]:
    """How a script stage runs its file: ``python FILE``, ``python -m MODULE``, or a program (a shell script,
    a binary) as it is."""
    py = python or sys.executable
    if python is not None and not python_program(python):
        raise ConfigError(f"script_app({str(script)!r}, python={python!r}): python= names a Python interpreter, "
                          f"whose file name starts with 'python' (python3.11, a venv's bin/python)")
    if module:
        return [py, "-m", str(script)]
    if runs_python(script):
        return [py, os.path.abspath(script)]
    if python is not None:
        raise ConfigError(f"script_app({str(script)!r}, python={python!r}): {script} is a program, not a Python "
                          f"script (it is executable and its first line is not a python #! line): leave out python=")
    return [os.path.abspath(script)]


def _script_target(script: Sequence[str] | None) -> tuple[str | None, str | None]:
    """(script file, module) a script stage runs: ``[python, FILE, ...]``, ``[python, -m, MODULE, ...]`` or
    ``[PROGRAM, ...]``."""
    if not script:
        return None, None
    words = script_command_length(script)
    return (None, str(script[2])) if words == 3 else (os.path.abspath(script[words - 1]), None)


def check_walltime(stage: str, walltime: Any) -> float | None:
    """Seconds, a finite number > 0 (None: no limit)."""
    if walltime is None:
        return None
    if isinstance(walltime, bool) or not isinstance(walltime, (int, float)) or not 0 < walltime < math.inf:
        raise ConfigError(f"stage {stage!r}: walltime={walltime!r} must be a number of seconds > 0 (or None "
                          f"for no limit)")
    return float(walltime)


def check_env(stage: str, env: dict[str, Any]) -> None:
    """Variable names (letters, digits, _), string values."""
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME.match(key):
            raise ConfigError(f"stage {stage!r}: env key {key!r} is not a variable name: use letters, digits "
                              f"and _, not starting with a digit")
        if not isinstance(value, str) or "\0" in value:
            raise ConfigError(f"stage {stage!r}: env[{key!r}] must be a string without NUL bytes")


def distributed_app(fn: Callable | None = None, *, name: str | None = None, num_nodes: int = 1,
                    ranks_per_node: int | None = None, walltime: float | None = None,
                    env: dict[str, str] | None = None, min_nodes: int | None = None):
    """Decorator: run ``fn`` on every rank of a Parsl MPI task, after ``setup_torch()``.

    ``name``: the stage name (default: the function's). ``num_nodes`` /
    ``ranks_per_node`` (default: the site's launch ranks per node) and
    ``walltime`` (seconds; every rank is stopped after it) can be given here
    and per call; ``env`` is exported to the ranks. ``min_nodes``: after its
    block lost nodes (and no spare is left), the stage (its retry) starts on
    the nodes left if there are at least this many; it learns its world size
    from ``setup_torch()``. Call it inside ``with pt.workflow(...)``; it
    returns a StageFuture. ``site=`` on a call runs it on another of the
    workflow's sites (``pt.workflow(sites=[...])``).
    """

    def decorate(f: Callable) -> DistributedApp:
        return DistributedApp(f, name=name, num_nodes=num_nodes, ranks_per_node=ranks_per_node,
                              walltime=walltime, env=env, min_nodes=min_nodes)

    return decorate(fn) if fn is not None else decorate


def script_app(script: str | os.PathLike, *, module: bool = False, args: Sequence[Any] = (),
               name: str | None = None, num_nodes: int = 1, ranks_per_node: int | None = None,
               walltime: float | None = None, env: dict[str, str] | None = None,
               python: str | None = None, min_nodes: int | None = None) -> DistributedApp:
    """A stage that runs an existing script (or ``module=True``: ``python -m``) on every rank.

    Every rank gets the torchrun variables (an unmodified torchrun-style
    script works) and starts in the stage's directory, so what it writes under
    a relative name is the stage's; the script path and the ``args`` that name
    an existing file or directory are taken from where the workflow runs.
    ``name``: the stage name (default: the script's stem; its folder's name
    for generic stems such as ``main.py``). ``min_nodes``: as ``distributed_app``'s.
    Its future resolves to 0 (the exit code). A call's positional arguments (strings, numbers, paths,
    Files, a previous stage's ``outputs[i]``, which the stage waits for) go on the script's command
    line after ``args``, as paths where they name files; an argument that names one of the call's
    ``outputs`` is that output's path in the stage's directory.
    """
    command = _script_head(script, module, python)
    for arg in args:
        check_script_argument(arg, f"script_app({str(script)!r}, args=...)")
    # (made absolute at each call, where the call's outputs are known: one of them lands in the stage's directory)
    return DistributedApp(None, script=[*command, *args], name=name or script_stage_name(script, module),
                          num_nodes=num_nodes, ranks_per_node=ranks_per_node, walltime=walltime, env=env,
                          python=python, min_nodes=min_nodes)


def submit_builtin(call: BuiltinCall, app: DistributedApp, check: Callable[[int, int, bool], None] | None = None
                   ) -> StageFuture:
    """A built-in stage: ``app`` (its function, by reference) with the files its config names; ``check``:
    what of its config needs the call's ranks (``DistributedApp.reading``)."""
    return app.reading(call.files, check)(call.config, inputs=list(call.inputs), outputs=list(call.outputs),
                                   stage=call.stage, num_nodes=call.num_nodes, ranks_per_node=call.ranks_per_node,
                                   walltime=call.walltime, site=call.site, min_nodes=call.min_nodes,
                                   env=call.env)
