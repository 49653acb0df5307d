"""Globus Compute: run the built-in stages on Aurora, Polaris or Frontier from
a laptop or login node, without SSH and without shipping code.

A built-in stage runs on the endpoint as a module entry point, launched as a
local stage is (parsl-torch's supervisor around ``$PARSL_MPI_PREFIX``, the
shim around each rank, ``python -m parsl_torch.stages.train --config-b64
...``) by ``run_stage_here``, which the engine runs with the stage's resource
specification: only JSON-like data travels, base64-encoded so neither the
shell nor ``str.format`` sees its braces and quotes; the supervisor's outcome
record says how a failed launch ended. The result is the
stage's summary: the endpoint-side paths of its history and checkpoint and a
small summary of the history, never the files themselves (the service's
result limit is 10 MB). Clients and executors are built by
``parsl_torch.sites.globus`` (credentials checked there).
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import os
import shlex
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ..common import settings, stagedir
from ..common.entrypoints import SHIM, SUPERVISE, stage_module
from ..common.files import open_private
from ..common.metadata import package_versions
from ..common.outcome import Cause, Outcome, failure_message, failure_result, forget_outcome, read_outcome
from ..errors import ConfigError, StageError
from ..sites.globus import make_client, make_executor
from .futures import StageFuture
from .request import BuiltinCall

__all__ = ["RemoteStages", "compare_versions", "make_client", "make_executor", "parse_result", "probe",
           "run_stage_here", "run_stage_on_endpoint", "stage_command", "submit_remote", "versions"]


def stage_command(stage: str, config: Mapping[str, Any], files: Mapping[str, str], python: str = "python",
                  launcher_args: Sequence[str] = (), num_ranks: int = 0, env_file: str | None = None,
                  timeout: float | None = None) -> str:
    """The shell command of a built-in stage on the endpoint, as a local stage's: parsl-torch's
    supervisor around ``$PARSL_MPI_PREFIX`` (which the MPI engine sets from the task's resource
    specification), the machine's binding flags (``launcher_args``), the shim around each rank."""
    module = stage_module(stage)
    if not stage.isidentifier() or importlib.util.find_spec(module) is None:
        raise ConfigError(f"stage {stage!r} cannot run remotely: it is not a built-in stage ({module} "
                          f"does not exist); use train or evaluate")
    encoded = base64.b64encode(json.dumps(dict(config)).encode()).decode()
    options = " ".join(f"--{name} {_quote(path)}" for name, path in files.items())
    flags = "".join(f"{_quote(arg)} " for arg in launcher_args)
    supervise = " ".join(filter(None, (f"{python} -m {SUPERVISE}", env_file and f"--env-file {_quote(env_file)}",
                                       timeout and f"--timeout {timeout:g}", f"--ranks {num_ranks}")))
    return (f"{supervise} -- $PARSL_MPI_PREFIX {flags}{python} -m {SHIM} -- "
            f"{python} -m {module} --config-b64 {encoded} {options}")


def _quote(word: str) -> str:
    if "{" in word or "}" in word:
        raise ConfigError(f"remote command word {word!r} contains braces, which ShellFunction formats: rename it")
    return shlex.quote(word)


def parse_result(stage: str, result: Any, outcome: Outcome | None = None) -> dict[str, Any]:
    """The stage's JSON summary from a ShellResult (or its dict form), or a StageError that says
    how the launch ended (the supervisor's outcome record) and shows the stderr's last lines."""
    get = result.get if isinstance(result, Mapping) else lambda k: getattr(result, k, None)
    code, stdout, stderr = get("returncode"), get("stdout") or "", get("stderr") or ""
    if code:
        tail = "\n".join(stderr.strip().splitlines()[-25:])
        how = f": {outcome.summary}" if outcome is not None and outcome.cause != Cause.OK else ""
        raise StageError(f"stage {stage!r} failed on the endpoint with exit code {code}{how}\n"
                         f"--- last lines of its stderr ---\n{tail}")
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise StageError(f"stage {stage!r} ended without a summary on stdout:\n{stdout[-2000:]}")


def run_stage_here(stage: str, config: dict[str, Any], files: Mapping[str, str], stage_dir: str, python: str,
                   time_limit: float | None = None, launcher_args: Sequence[str] = (),
                   rank_env: Mapping[str, str] | None = None, num_ranks: int = 0) -> dict[str, Any]:
    """Runs on the endpoint, in a task with a resource specification: the stage on every rank,
    ``stage_dir`` holding what a local stage's holds (the ranks' environment file, the
    supervisor's records), then its summary or the error it ended with."""
    from globus_compute_sdk import ShellFunction

    for path in (*files.values(), Path(stage_dir) / stagedir.ENV):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    stage_dir = Path(stage_dir)
    env_file = stage_dir / stagedir.ENV
    with open_private(env_file) as f:
        f.write(json.dumps({settings.STAGE_DIR.name: str(stage_dir), **(rank_env or {})}).encode())
    forget_outcome(stage_dir)
    command = stage_command(stage, config, files, python, launcher_args, num_ranks, str(env_file), time_limit)
    result = ShellFunction(f"cd {_quote(str(stage_dir))} && {command}")()
    try:
        return parse_result(stage, result, read_outcome(stage_dir))
    except StageError as exc:
        return failure_result(str(exc))


def run_stage_on_endpoint(stage: str, config: dict[str, Any], python: str, time_limit: float | None,
                          input_roles: tuple[str, ...], output_roles: tuple[str, ...],
                          launcher_args: tuple[str, ...] = (), rank_env: dict[str, str] | None = None,
                          inputs: tuple = (), outputs: tuple = (),
                          parsl_resource_specification: dict | None = None) -> dict[str, Any]:
    """Runs on the endpoint's MPI engine (a workflow's Parsl app): ``run_stage_here`` with the files
    named by role (``--history``, ``--checkpoint``) from the app's resolved inputs/outputs.
    ``parsl_resource_specification`` is how Parsl asks the engine for the stage's nodes and ranks."""
    files = {role: os.fspath(f) for role, f in zip((*input_roles, *output_roles), (*inputs, *outputs))}
    stage_dir = os.path.dirname(os.fspath(outputs[0]))  # outputs are placed in the stage's remote directory
    # (not named walltime: Parsl treats an app parameter of that name as its own)
    return run_stage_here(stage, config, files, stage_dir, python, time_limit, launcher_args, rank_env,
                          (parsl_resource_specification or {}).get("num_ranks", 0))


@functools.lru_cache(maxsize=1)
def _remote_app():
    from parsl import python_app

    return python_app(run_stage_on_endpoint, executors=["mpi"], cache=True)


def submit_remote(wf: Any, call: BuiltinCall) -> StageFuture:
    """A built-in stage of workflow ``wf`` as one task on its site's endpoint:
    files under the site's ``remote_run_dir``/<run dir name>/<stage>."""
    nodes, ppn = call.num_nodes or 1, call.ranks_per_node or wf.ranks_per_node
    wf.check_resources(call.name, nodes, ppn)
    name = wf.stage_name(call.name, explicit=call.stage is not None)
    g = wf.site.spec.globus
    remote_dir = f"{g.remote_run_dir.rstrip('/')}/{wf.run_dir.name}/{name}"
    outputs = [wf.place(o, Path(remote_dir)) for o in call.outputs]
    spec = {"num_nodes": nodes, "ranks_per_node": ppn, "num_ranks": nodes * ppn}
    app_future = _remote_app()(call.builtin, call.config, g.python, call.walltime, call.input_roles,
                               call.output_roles, wf.launcher_args(ppn), wf.rank_env(), inputs=list(call.inputs),
                               outputs=outputs, parsl_resource_specification=spec)
    future = StageFuture(name, app_future, None, None)
    wf.track(future, nodes * ppn)
    return future


class RemoteStages:
    """Direct submission of built-in stages to an endpoint, without Parsl."""

    def __init__(self, executor: Any, remote_run_dir: str, python: str = "python") -> None:
        self.executor, self.remote_run_dir, self.python = executor, remote_run_dir.rstrip("/"), python
        self._lock = threading.Lock()  # resource_specification is per executor: set and submit together

    def submit(self, stage: str, config: Mapping[str, Any], files: Mapping[str, str], *,
               num_nodes: int = 1, ranks_per_node: int = 1, walltime: float | None = None,
               launcher_args: Sequence[str] = (), rank_env: Mapping[str, str] | None = None) -> Future:
        """A future of the stage's summary; relative file names go under the remote run directory."""
        files = {k: v if v.startswith("/") else f"{self.remote_run_dir}/{stage}/{v}" for k, v in files.items()}
        ranks = num_nodes * ranks_per_node
        with self._lock:
            self.executor.resource_specification = {"num_nodes": num_nodes, "ranks_per_node": ranks_per_node,
                                                    "num_ranks": ranks}
            inner = self.executor.submit(run_stage_here, stage, dict(config), files,
                                         f"{self.remote_run_dir}/{stage}", self.python, walltime,
                                         tuple(launcher_args), dict(rank_env or {}), ranks)
        outer: Future = Future()

        def finish(f: Future) -> None:
            try:
                value = f.result()
                if (failed := failure_message(value)) is not None:
                    raise StageError(failed)
                outer.set_result(value)
            except BaseException as exc:  # noqa: BLE001 - hand every failure to the caller
                outer.set_exception(exc)

        inner.add_done_callback(finish)
        return outer


def versions() -> dict[str, str]:
    """What this Python has (runs on the endpoint for ``parsl-torch remote probe``)."""
    return package_versions()


def compare_versions(local: Mapping[str, str], remote: Mapping[str, str]) -> list[str]:
    """Warnings for the differences that break remote calls silently."""
    warnings = []
    lv, rv = local.get("python", ""), remote.get("python", "")
    if lv.split(".")[:2] != rv.split(".")[:2]:
        warnings.append(f"python {lv} here but {rv} on the endpoint: functions pickled here may not load there")
    for dist in ("parsl-torch", "parsl", "globus-compute-sdk", "torch"):
        if dist in local and local.get(dist) != remote.get(dist):
            warnings.append(f"{dist} {local[dist]} here but {remote.get(dist, 'missing')} on the endpoint")
    return warnings


#: what a one-process task asks of an MPI engine, which refuses a task without a resource specification
ONE_PROCESS = {"num_nodes": 1, "ranks_per_node": 1, "num_ranks": 1}


def probe(executor: Any) -> tuple[dict[str, str], list[str]]:
    """Remote versions and the mismatch warnings."""
    executor.resource_specification = dict(ONE_PROCESS)
    remote = executor.submit(versions).result(timeout=600)
    return remote, compare_versions(versions(), remote)
