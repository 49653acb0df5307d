"""What a stage's worker does before its ranks start (the body of the stage's Parsl bash
app, and of a remote stage's task on an endpoint): make the stage directory this
attempt's, leave the ranks' call in it (the pickled function, or a script's argv,
and the environment, all 0600), and return the command that launches the ranks::

    python -m parsl_torch.launch.supervise --env-file .env.json --timeout T -- $PARSL_MPI_PREFIX \\
        python -m parsl_torch.launch.shim -- python -m parsl_torch.apps.stage.main PAYLOAD RESULT
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...common import settings
from ...common.entrypoints import SHIM, STAGE_MAIN, SUPERVISE
from ...common.files import open_private
from ...common.outcome import forget_outcome
from ...common.stagedir import ARGV as ARGV_FILE
from ...common.stagedir import ENV as ENV_FILE
from ...common.stagedir import IDENTITY, PAYLOAD, PREVIOUS, RESULT, STARTED, STDERR, STDOUT, IdentityRecord
from ...common.stagedir import read as read_record
from ...core.log import get_logger
from ...errors import StageError
from ...launch.packing import MIN_NODES_KEY
from .. import identity
from .call import StageCall
from ..identity.freshdir import start_fresh
from ..identity.verdict import gate
from .options import ShippedFunction, StageOptions, plain_files
from .scriptargs import command_text


@functools.lru_cache(maxsize=None)
def bash_app_for(label: str, cache: bool = True):
    """The Parsl bash app of a stage on the executor ``label`` (``cache``: memoized)."""
    from parsl import bash_app

    return bash_app(stage_command, executors=[label], cache=cache, ignore_for_cache=["stdout", "stderr"])


def stage_command(call: StageCall, *args: Any, inputs: Sequence = (), outputs: Sequence = (),
                  stdout: str | None = None, stderr: str | None = None,
                  parsl_resource_specification: dict | None = None, **kwargs: Any) -> str:
    """Body of the Parsl bash app (runs on the worker): make the stage directory this attempt's,
    leave the ranks' call in it, return the command.

    ``stdout``, ``stderr`` and ``parsl_resource_specification`` are Parsl's:
    it reads them from the call (redirection, the MPI task's nodes)."""
    return _command(call, prepare_call(call, args, inputs, outputs, kwargs))


def prepare_call(call: StageCall, args: tuple, inputs: Sequence, outputs: Sequence, kwargs: dict[str, Any]) -> str:
    """Make the stage directory this attempt's and leave the ranks' call in it; returns the ranks'
    command after the shim (a warm stage's ranks read the same files: ``apps.warm``)."""
    opts = call.opts
    who = attempt_identity(call, args, {**kwargs, "inputs": inputs, "outputs": outputs})
    _begin_attempt(call, who.call_id)
    for output in outputs:  # (``ckpt/model.pt``: its folder is there for the ranks to write into)
        Path(os.fspath(getattr(output, "filepath", output))).parent.mkdir(parents=True, exist_ok=True)
    if call.fn is not None:
        given = {"inputs": list(inputs), "outputs": list(outputs)}
        kwargs.update({k: v for k, v in given.items() if k in call.fn.takes})
        rank_cmd = _write_payload(opts.stage_dir, call.fn, args, kwargs)
    else:
        rank_cmd = _write_argv(opts.stage_dir, [*call.script, *map(command_text, args)])
    _write_env(opts, who.call_id)
    return rank_cmd


def attempt_identity(call: StageCall, args: tuple, kwargs: dict[str, Any]) -> IdentityRecord:
    """Who the call is that this attempt runs (its ranks resume a checkpoint only if it was written under
    the same identity): what its verdict left in the stage directory; a fixed one (a warm group's serving
    call); in your own Parsl config, which has no verdict of ours, its identity computed here."""
    if call.id is not None:
        return IdentityRecord(call.id)
    if call.identify_on_worker:  # (Parsl's memoizer decides whether it runs: here, what it runs, as ours would)
        found = gate(call, args, kwargs, identity.DigestCache.of_run_dir(Path(call.opts.stage_dir).parent),
                     lambda key: False)
        if found.anew:
            get_logger("parsl_torch.workflow").info("[%s] a new computation (%s)", call.stage, found.anew)
        return IdentityRecord(found.computation)
    record = read_record(Path(call.opts.stage_dir) / IDENTITY, IdentityRecord)
    if record is None:
        raise StageError(f"stage {call.stage!r}: no verdict left its identity in {call.opts.stage_dir} (it was "
                         f"removed while the stage was starting?): run the workflow again")
    return record


def _begin_attempt(call: StageCall, call_id: str) -> None:
    """From now on the directory holds this attempt's files: another call's files go to ``.previous/``
    (``freshdir``; the verdict said so, else it is said here), this call's record and launch outcome go
    (they must not explain this attempt), its earlier logs are kept aside, ``status`` sees it run."""
    stage_dir = call.opts.stage_dir
    moved = start_fresh(stage_dir, call_id)
    if moved and call.identify_on_worker:
        get_logger("parsl_torch.workflow").info("[%s] a new call: the previous call's files go to %s/%s/",
                                                call.stage, call.stage, PREVIOUS)
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
    """A script's command line (its call's arguments last, resolved) in a private file the shim reads
    (its arguments may hold secrets)."""
    argv_file = os.path.join(stage_dir, ARGV_FILE)
    with open_private(argv_file) as f:
        f.write(json.dumps([command_text(a) for a in script]).encode())
    return f"--argv-file {shlex.quote(argv_file)}"


def _write_env(opts: StageOptions, call: str) -> None:
    """The stage's environment for the supervisor, in a private file, not on the command line,
    which Parsl echoes into stderr.txt (and so into errors): its values may be secrets."""
    env = {**opts.environment, settings.CALL_ID.name: call, settings.OBSERVE.name: "1"}  # (its reads: ``observed``)
    if opts.rank_path:  # the ranks import what the workflow imports from its own folders
        env["PYTHONPATH"] = os.pathsep.join(opts.rank_path)
    with open_private(os.path.join(opts.stage_dir, ENV_FILE)) as f:
        f.write(json.dumps(env).encode())


def _command(call: StageCall, rank_cmd: str) -> str:
    opts = call.opts
    py = shlex.quote(sys.executable)
    flags = f"--timeout {opts.walltime:g} " if opts.walltime else ""
    if opts.preflight and opts.num_nodes > 1:
        flags += f"--preflight {opts.preflight:g} "
    # after a lost node it goes on in place: on a spare of its block's, else on the nodes left, as many as its
    # min_nodes; not a warm group's serving call (a fixed id): the group ends with its node, and the workflow
    # runs the call elsewhere
    if call.id is None:
        flags += "--in-place "
        if call.fn is not None:  # a function stage's ranks can be kept up through the loss (``stage.kept``)
            flags += "--keep-ranks "
        if (fewest := call.resource_specification.get(MIN_NODES_KEY)) is not None:
            flags += f"--min-nodes {fewest} "
    if call.returns:  # rank 0 must leave its return value, or the stage failed
        flags += f"--result {RESULT} "
    binding = shlex.join(opts.launcher_args)
    return (f"cd {shlex.quote(opts.stage_dir)} && {py} -m {SUPERVISE} --env-file {ENV_FILE} {flags}"
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
