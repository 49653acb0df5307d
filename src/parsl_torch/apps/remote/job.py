"""One stage on a Globus Compute endpoint: the task that runs there, and what comes back.

A stage on a Globus Compute site is one task on the endpoint's MPI engine
(its resource specification: the stage's nodes and ranks). The task does what
a local stage's worker and memoizer do, on the endpoint's file system, where
the stage's files are:

* its identity is completed there: the code components come with the job
  (read where the workflow runs: the function's fingerprint and the user
  modules it reaches; a script's own are read there), the arguments and every
  file the stage reads are digested there;
* a stage whose directory holds the files of the same call is not run again
  (the promise a skip makes is checked where the files are);
* otherwise its directory becomes this attempt's and its ranks are launched
  as a local stage's are (``stage.cold``); the user modules the function reaches
  travel with the job and are put first on the ranks' import path.

What comes back is a ``RemoteAnswer``: rank 0's return value (pickled, under
the service's 10 MiB result limit), why the stage ran, or the error that
names the rank, as a local stage's does. Files stay on the endpoint.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...common.stagedir import RESULT, SOURCES, STDERR, STDOUT
from ...errors import ConfigError, StageError
from .. import identity
from ..stage.call import StageCall
from ..stage.failures import stage_error
from ..identity.verdict import Verdict, gate
from ..stage.cold import stage_command

#: what Globus Compute carries back from a task (the endpoint refuses a larger result)
RESULT_LIMIT = 10 * 1024 * 1024
#: room left in a result for the answer around the value
_ANSWER_ROOM = 64 * 1024


@dataclass(frozen=True)
class RemoteJob:
    """One stage call as it travels to the endpoint; the call's own arguments travel beside it (Parsl
    resolves the futures among them first). ``opts`` name the endpoint's paths."""

    call: StageCall  # its options name the endpoint's paths; a script's Python is the endpoint's
    python: str | None = None  # a script's Python on the endpoint (None: the engine's own)
    #: the code components, read where the workflow runs (a function's); None: read on the endpoint (a script's)
    code: tuple[tuple[str, str], ...] | None = None
    #: the user modules the function reaches: (path under an import root, source)
    sources: tuple[tuple[str, bytes], ...] = ()
    memoize: bool = True

    @property
    def stage(self) -> str:
        return self.call.stage


@dataclass(frozen=True)
class RemoteAnswer:
    """What a stage's task returns: rank 0's value (dill), why it ran (None: skipped, its directory
    holds this call's files), or the error it ended with."""

    stage: str
    value: bytes | None = None
    ran: str | None = None
    error: str | None = None

    def unwrapped(self) -> tuple[Any, bool]:
        """(rank 0's return value, whether the endpoint skipped the stage), or the stage's StageError."""
        return self.result(), self.error is None and self.ran is None

    def result(self) -> Any:
        """Rank 0's return value (None for a script), or the stage's StageError."""
        if self.error is not None:
            raise StageError(self.error)
        if self.value is None:
            return None
        import dill

        return dill.loads(self.value)


def run_job(job: RemoteJob, *args: Any, inputs: Sequence = (), outputs: Sequence = (),
            parsl_resource_specification: dict | None = None, **kwargs: Any) -> RemoteAnswer:
    """Runs on the endpoint (a task with the stage's resource specification, which is how Parsl asks the
    engine for its ranks): the stage, unless its directory holds this call's files."""
    stage_dir = Path(job.call.opts.stage_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    kwargs = {**kwargs, "inputs": list(inputs), "outputs": list(outputs)}
    try:
        call = _here(job)
        digests = identity.DigestCache.of_run_dir(stage_dir.parent)
        found = gate(call, args, kwargs, digests, lambda key: job.memoize and _holds(stage_dir, call, key),
                     code=None if job.code is None else dict(job.code))
    except ConfigError as exc:
        return RemoteAnswer(job.stage, error=str(exc))
    if found.skips:
        return RemoteAnswer(job.stage, _value(stage_dir, call))
    why = f"{found.why}; set aside: {', '.join(found.moved)}" if found.moved else str(found.why)
    return _ran(job, call, found, why, args, kwargs, digests)


def _ran(job: RemoteJob, call: StageCall, found: Verdict, why: str, args: tuple, kwargs: dict[str, Any],
         digests: identity.DigestCache) -> RemoteAnswer:
    """The stage run here (its shipped modules first on the ranks' path): its value, or its error; its call's
    record written when it succeeded."""
    stage_dir = Path(call.opts.stage_dir)
    if job.sources:  # only a stage that runs needs them (they are not part of what is compared)
        try:
            shipped = str(_unpack(stage_dir / SOURCES, job.sources))
        except ConfigError as exc:
            return RemoteAnswer(job.stage, error=str(exc))
        call = replace(call, opts=replace(call.opts, import_path=(shipped, *call.opts.import_path)))
    code = _launch(call, args, kwargs)
    if code:
        from parsl.app.errors import BashExitFailure

        return RemoteAnswer(job.stage, error=str(stage_error(job.stage, BashExitFailure(job.stage, code),
                                                             stage_dir / STDERR)))
    value = _value(stage_dir, call)
    if value is False:
        return RemoteAnswer(job.stage, error=f"stage {job.stage!r} finished but left no result in {stage_dir}")
    if value is not None and len(value) > RESULT_LIMIT - _ANSWER_ROOM:
        return RemoteAnswer(job.stage, error=(
            f"stage {job.stage!r} returned {len(value) / 2**20:.1f} MiB, more than Globus Compute carries back "
            f"({RESULT_LIMIT // 2**20} MiB): write it to a file in outputs= (it stays on the endpoint, in "
            f"{stage_dir}) and return its path or a summary"))
    identity.write_call(stage_dir, found.key, found.parts, kwargs["outputs"], digests, call.opts.environment)
    return RemoteAnswer(job.stage, value, why)


def _holds(stage_dir: Path, call: StageCall, key: str) -> bool:
    """Whether the stage's directory holds the result of the call ``key`` (the cache of an endpoint's stage):
    that call's record, and its return value if it has one."""
    record = identity.read_call(stage_dir)
    return record is not None and record.memo_key == key and _value(stage_dir, call) is not False


def _here(job: RemoteJob) -> StageCall:
    """The job's call on this machine: a script run by this machine's Python."""
    call = job.call
    return call if call.fn is not None else replace(call, script=(job.python or sys.executable, *call.script[1:]))


def _unpack(root: Path, sources: Sequence[tuple[str, bytes]]) -> Path:
    """The shipped user modules under ``root`` (replacing what an earlier call left there)."""
    shutil.rmtree(root, ignore_errors=True)
    for relative, source in sources:
        path = root / relative
        if not path.resolve().is_relative_to(root.resolve()):
            raise ConfigError(f"shipped module path {relative!r} leaves its folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(source)
    return root


def _launch(call: StageCall, args: tuple, kwargs: Mapping[str, Any]) -> int:
    """The ranks, launched as a local stage's worker launches them; their exit code."""
    command = stage_command(call, *args, **kwargs)
    stage_dir = Path(call.opts.stage_dir)
    with open(stage_dir / STDOUT, "ab") as out, open(stage_dir / STDERR, "ab") as err:
        return subprocess.run(["/bin/bash", "-c", command], stdin=subprocess.DEVNULL, stdout=out,
                              stderr=err, check=False).returncode


def _value(stage_dir: Path, call: StageCall) -> bytes | None | bool:
    """Rank 0's pickled return value; None for a script (it returns nothing); False when it is missing."""
    if not call.returns:
        return None
    try:
        return (stage_dir / RESULT).read_bytes()
    except OSError:
        return False
