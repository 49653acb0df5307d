"""Distributed torch tasks as Parsl apps.

``@distributed_app`` turns a function into a stage that runs on every rank
after ``setup_torch()``: one Parsl bash app on the site's ``mpi`` executor,
whose command is::

    python -m parsl_torch.launch.supervise --timeout T -- $PARSL_MPI_PREFIX \\
        python -m parsl_torch.launch.shim -- python -m parsl_torch.apps.stage_main PAYLOAD RESULT

(supervise: fail fast and leave nothing behind; the shim: torchrun variables
and failure reports; stage_main: set up torch, run the function, rank 0 keeps
its return value). The call returns a ``StageFuture`` (``futures``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path, PurePath
from typing import Any

from ..common import settings
from ..common.entrypoints import SHIM, STAGE_MAIN, SUPERVISE
from ..common.files import open_private
from ..common.outcome import forget_outcome
from ..common.records import ENV_NAME
from ..common.stagedir import ARGV as ARGV_FILE
from ..common.stagedir import ENV as ENV_FILE
from ..common.stagedir import PAYLOAD, RESULT, STARTED, STDERR, STDOUT
from ..errors import ConfigError
from . import identity
from .fingerprint import Fingerprinter, Unidentifiable
from .futures import StageFuture
from .memo import stage_components
from .payload import ShippedFunction, StageOptions, plain_files
from .remote import submit_remote
from .request import BuiltinCall
from .usercode import rank_import_path
from .workflow import current_workflow


def _stage_command(fn: ShippedFunction | None, script: Sequence[str] | None, opts: StageOptions,
                   *args: Any, inputs: Sequence = (), outputs: Sequence = (), stdout: str | None = None,
                   stderr: str | None = None, parsl_resource_specification: dict | None = None,
                   parsl_torch_call: str | None = None, **kwargs: Any) -> str:
    """Body of the Parsl bash app (runs on the worker): make the stage directory this attempt's,
    leave the ranks' call in it, return the command.

    ``stdout``, ``stderr`` and ``parsl_resource_specification`` are Parsl's:
    it reads them from the call (redirection, the MPI task's nodes);
    ``parsl_torch_call`` is the call's identity, from the stage memoizer."""
    # who this call is: its ranks resume a checkpoint only if it was written under the same identity
    call = parsl_torch_call or identity.call_id(stage_components(
        opts, script, args, {**kwargs, "inputs": inputs, "outputs": outputs},
        identity.DigestCache.of_run_dir(Path(opts.stage_dir).parent)))
    _begin_attempt(opts.stage_dir)
    if fn is not None:
        kwargs.update({k: v for k, v in {"inputs": list(inputs), "outputs": list(outputs)}.items() if k in fn.takes})
        rank_cmd = _write_payload(opts.stage_dir, fn, args, kwargs)
    else:
        rank_cmd = _write_argv(opts.stage_dir, script or ())
    _write_env(opts, call)
    return _command(opts, rank_cmd)


def _begin_attempt(stage_dir: str) -> None:
    """From now on the directory holds this attempt's files: an earlier call's record and launch
    outcome go (they must not explain this one), earlier logs are kept aside, ``status`` sees it run."""
    identity.forget_call(stage_dir)
    forget_outcome(stage_dir)
    _keep_earlier_attempt(stage_dir)
    Path(stage_dir, STARTED).touch()


def _write_payload(stage_dir: str, fn: ShippedFunction, args: tuple, kwargs: dict[str, Any]) -> str:
    """The pickled call (0600: its arguments may hold secrets); the ranks' command after the shim."""
    import dill

    payload, result = os.path.join(stage_dir, PAYLOAD), os.path.join(stage_dir, RESULT)
    if os.path.exists(result):
        os.unlink(result)  # a stale value must never pass for this run's
    with open_private(payload) as f:
        dill.dump((fn, plain_files(args), plain_files(kwargs)), f)
    py = shlex.quote(sys.executable)
    return f"-- {py} -m {STAGE_MAIN} {shlex.quote(payload)} {shlex.quote(result)}"


def _write_argv(stage_dir: str, script: Sequence[Any]) -> str:
    """A script's command line in a private file the shim reads (its arguments may hold secrets)."""
    argv_file = os.path.join(stage_dir, ARGV_FILE)
    with open_private(argv_file) as f:
        f.write(json.dumps([os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in script]).encode())
    return f"--argv-file {shlex.quote(argv_file)}"


def _write_env(opts: StageOptions, call: str) -> None:
    """The stage's environment for the supervisor, in a private file, not on the command line,
    which Parsl echoes into stderr.txt (and so into errors): its values may be secrets."""
    env = dict((*opts.env, (settings.CALL_ID.name, call)))
    if opts.import_path:  # the ranks import what the workflow imports from its own folders
        env["PYTHONPATH"] = os.pathsep.join(opts.import_path)
    with open_private(os.path.join(opts.stage_dir, ENV_FILE)) as f:
        f.write(json.dumps(env).encode())


def _command(opts: StageOptions, rank_cmd: str) -> str:
    py = shlex.quote(sys.executable)
    timeout = f"--timeout {opts.walltime:g} " if opts.walltime else ""
    binding = shlex.join(opts.launcher_args)
    return (f"cd {shlex.quote(opts.stage_dir)} && {py} -m {SUPERVISE} --env-file {ENV_FILE} {timeout}"
            f"--ranks {opts.num_ranks} -- $PARSL_MPI_PREFIX {binding} {py} -m {SHIM} {rank_cmd}")


def _keep_earlier_attempt(stage_dir: str) -> None:
    """Each attempt gets its own stdout/stderr: an earlier attempt's (a Parsl retry, a rerun)
    become ``stdout.1.txt``, ``stderr.1.txt``, ... before Parsl opens the files for this one,
    which are made here, readable by their owner only."""
    logs = [Path(stage_dir, name) for name in (STDOUT, STDERR)]
    if any(p.exists() and p.stat().st_size for p in logs):
        n = 1
        while any(p.with_suffix(f".{n}.txt").exists() for p in logs):
            n += 1
        for p in logs:
            if p.exists():
                p.rename(p.with_suffix(f".{n}.txt"))
    for p in logs:  # what a stage prints may hold secrets: its owner's only (Parsl appends to them)
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o600))
        os.chmod(p, 0o600)


@functools.lru_cache(maxsize=None)
def _bash_app(label: str = "mpi", cache: bool = True):
    from parsl import bash_app

    return bash_app(_stage_command, executors=[label], cache=cache, ignore_for_cache=["stdout", "stderr"])


class DistributedApp:
    """A stage: ``fn`` on every rank (``fn=None``: a script or module via ``script``).

    ``files``: files and directories the stage reads besides ``inputs=`` (a script's
    arguments, a built-in stage's data file), part of its identity."""

    def __init__(self, fn: Callable | None, *, script: Sequence[str] | None = None, name: str | None = None,
                 num_nodes: int = 1, ranks_per_node: int | None = None, walltime: float | None = None,
                 env: dict[str, str] | None = None, files: Sequence[str] = ()) -> None:
        self.fn, self.script = fn, tuple(script) if script else None
        self.name = name or fn.__name__  # a script's name is given by script_app
        self.num_nodes, self.ranks_per_node = num_nodes, ranks_per_node
        self.walltime, self.env = walltime, dict(env or {})
        self.files = tuple(files)
        if fn is not None:
            functools.update_wrapper(self, fn)

    def reading(self, files: Sequence[str]) -> DistributedApp:
        """This stage, also identified by the content of ``files``."""
        return DistributedApp(self.fn, script=self.script, name=self.name, num_nodes=self.num_nodes,
                              ranks_per_node=self.ranks_per_node, walltime=self.walltime, env=self.env,
                              files=(*self.files, *files))

    def __call__(self, *args: Any, inputs: Sequence = (), outputs: Sequence = (), stage: str | None = None,
                 num_nodes: int | None = None, ranks_per_node: int | None = None,
                 walltime: float | None = None, env: dict[str, str] | None = None, **kwargs: Any) -> StageFuture:
        wf = current_workflow(self.name)
        if wf.remote:
            raise ConfigError(f"stage {stage or self.name!r}: site {wf.site.name!r} runs stages through Globus "
                              f"Compute, where only the built-in stages run (train, evaluate: module entry "
                              f"points, no code shipped); run functions from a workflow script on a site "
                              f"with a shared file system")
        nodes = num_nodes or self.num_nodes
        ppn = ranks_per_node or self.ranks_per_node or wf.ranks_per_node
        walltime = check_walltime(stage or self.name, walltime if walltime is not None else self.walltime)
        stage_env = {**self.env, **(env or {})}  # per call over the decorator's
        check_env(stage or self.name, stage_env)
        wf.check_resources(stage or self.name, nodes, ppn)  # before anything is named or made
        check_inputs(stage or self.name, inputs)
        # a Path argument names a file where the workflow runs; the ranks start in the stage's directory
        args = tuple(_absolute(a) for a in args)
        kwargs = {k: _absolute(v) for k, v in kwargs.items()}
        self._check_arguments(stage or self.name, args, kwargs)
        code, roots = self._code(stage or self.name, wf.digests)
        stage = wf.stage_name(stage or self.name, explicit=stage is not None)
        stage_dir = wf.run_dir / stage
        stage_dir.mkdir(parents=True, exist_ok=True)
        env = {settings.RUN_DIR.name: str(wf.run_dir), settings.STAGE_DIR.name: str(stage_dir), **wf.rank_env(),
               **stage_env}
        shipped = ShippedFunction.of(self.fn) if self.fn is not None else None
        script, module = _script_target(self.script)
        opts = StageOptions(str(stage_dir), nodes, ppn, walltime, tuple(env.items()), wf.launcher_args(ppn),
                            code=code, code_roots=roots, script=script, module=module, files=self.files,
                            import_path=rank_import_path())
        outputs = [wf.place(o, stage_dir) for o in outputs]
        spec = {"num_nodes": nodes, "ranks_per_node": ppn, "num_ranks": nodes * ppn}
        app_future = _bash_app(wf.mpi_label, wf.memoize)(shipped, self.script, opts, *args, inputs=list(inputs),
                                 outputs=outputs, stdout=str(stage_dir / STDOUT), stderr=str(stage_dir / STDERR),
                                 parsl_resource_specification=spec, **kwargs)
        future = StageFuture(stage, app_future, stage_dir / STDERR,
                             stage_dir / RESULT if self.fn is not None else None)
        wf.track(future, nodes * ppn)
        return future

    def _check_arguments(self, stage: str, args: tuple, kwargs: dict[str, Any]) -> None:
        """Arguments that are not futures need an identity now, so one without fails before anything
        is submitted (the files they name are read when the stage is ready to run)."""
        fp = Fingerprinter(lambda path: "", strict=True)
        names = _parameter_names(self.fn, len(args)) if self.fn is not None else []
        for i, value in enumerate(args):
            if not isinstance(value, Future):
                _identifiable(stage, fp, value, f"argument {names[i] if i < len(names) else i + 1!r}")
        for key, value in kwargs.items():
            if not isinstance(value, Future):
                _identifiable(stage, fp, value, f"argument {key!r}")

    def _code(self, stage: str, cache: identity.DigestCache) -> tuple[str, tuple[tuple[str, str], ...]]:
        """The function's fingerprint and the user modules it reaches (a script's are read from its file)."""
        if self.fn is None:
            return "", ()
        fp = Fingerprinter(cache.file_digest, strict=False)
        code = fp.digest(self.fn, f"stage {stage!r}")
        cache.save()
        return code, tuple(sorted(fp.roots))


def _absolute(value: Any) -> Any:
    return type(value)(os.path.abspath(value)) if isinstance(value, PurePath) else value


def _parameter_names(fn: Callable, n: int) -> list[str]:
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:n]


def _identifiable(stage: str, fp: Fingerprinter, value: Any, where: str) -> None:
    try:
        fp.token(value, where)
    except Unidentifiable as exc:
        raise ConfigError(f"stage {stage!r}: {exc}") from None


def _script_target(script: Sequence[str] | None) -> tuple[str | None, str | None]:
    """(script file, module) a script stage runs: ``[python, FILE, ...]`` or ``[python, -m, MODULE, ...]``."""
    if not script:
        return None, None
    if len(script) > 2 and script[1] == "-m":
        return None, str(script[2])
    return os.path.abspath(script[1]), None


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
               name: str | None = None, num_nodes: int = 1, ranks_per_node: int | None = None,
               walltime: float | None = None, env: dict[str, str] | None = None,
               python: str | None = None) -> DistributedApp:
    """A stage that runs an existing script (or ``module=True``: ``python -m``) on every rank.

    Every rank gets the torchrun variables (an unmodified torchrun-style
    script works) and starts in the stage's directory, so what it writes under
    a relative name is the stage's; the script path and the ``args`` that name
    an existing file or directory are taken from where the workflow runs.
    ``name``: the stage name (default: the script's stem; its folder's name
    for generic stems such as ``main.py``). Its future resolves to 0 (the exit code).
    """
    py = python or sys.executable
    command = [py, "-m", str(script)] if module else [py, os.path.abspath(script)]
    args = [caller_path(a) for a in args]
    return DistributedApp(None, script=[*command, *args], name=name or script_stage_name(script, module),
                          num_nodes=num_nodes, ranks_per_node=ranks_per_node, walltime=walltime, env=env,
                          files=[p for p in map(named_path, args) if p is not None])


#: script stems that say nothing about the script: the stage is named after its folder
GENERIC_STEMS = ("main", "__main__", "run", "script", "app", "cli")


def script_stage_name(script: str | os.PathLike, module: bool) -> str:
    """``mingpt/main.py`` -> ``mingpt``; ``pkg.train`` -> ``train``; ``pkg.__main__`` -> ``pkg``."""
    parts = str(script).split(".") if module else [*Path(os.path.abspath(script)).parent.parts[-1:],
                                                     Path(script).stem]
    if len(parts) > 1 and parts[-1] in GENERIC_STEMS and parts[-2] not in ("", os.sep):
        return parts[-2]
    return parts[-1]


def caller_path(arg: Any) -> Any:
    """An argument naming an existing file or directory relative to the caller (``data/x.npy``,
    ``--data=data/x.npy``, a ``Path``) made absolute: the ranks start in the stage's directory."""
    if isinstance(arg, os.PathLike) and not hasattr(arg, "filepath"):
        return os.path.abspath(arg)
    if not isinstance(arg, str) or not arg or os.path.isabs(arg):
        return arg
    flag, eq, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
    if value and not os.path.isabs(value) and os.path.exists(value):
        return f"{flag}{eq}{os.path.abspath(value)}"
    return arg


def named_path(arg: Any) -> str | None:
    """The existing file or directory an argument names (after ``caller_path``): ``/d/x.npy``,
    ``--data=/d/x.npy``, a ``Path``; None for anything else."""
    if isinstance(arg, os.PathLike) and not hasattr(arg, "filepath"):
        arg = os.fspath(arg)
    if not isinstance(arg, str):
        return None
    value = arg.partition("=")[2] if arg.startswith("-") else arg
    return value if value and os.path.isabs(value) and os.path.exists(value) else None


def submit_builtin(call: BuiltinCall, app: DistributedApp) -> StageFuture:
    """A built-in stage: ``app`` here, or on a Globus Compute site its module entry point on the
    endpoint (only its config travels; see ``remote``)."""
    wf = current_workflow(call.name)
    if wf.remote:
        return submit_remote(wf, call)
    return app.reading(call.files)(call.config, inputs=list(call.inputs), outputs=list(call.outputs),
                                   stage=call.stage, num_nodes=call.num_nodes, ranks_per_node=call.ranks_per_node,
                                   walltime=call.walltime)
