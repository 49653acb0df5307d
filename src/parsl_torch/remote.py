"""Globus Compute: run the built-in stages on Aurora, Polaris or Frontier from
a laptop or login node, without SSH and without shipping code.

A built-in stage runs on the endpoint as a module entry point through
``MPIFunction`` (``$PARSL_MPI_PREFIX python -m parsl_torch.stages.train
--config-b64 ...``): only JSON-like data travels, base64-encoded so neither
the shell nor ``str.format`` sees its braces and quotes. The result is the
stage's summary: the endpoint-side paths of its history and checkpoint and a
small summary of the history, never the files themselves (the service's
result limit is 10 MB).

Credentials: ``GLOBUS_COMPUTE_CLIENT_ID``/``GLOBUS_COMPUTE_CLIENT_SECRET``
(non-interactive), else the user's existing login; with neither and no
terminal to log in from, a clear error instead of a prompt that would hang.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from .errors import ConfigError, StageError

STAGE_MODULES = {"train": "parsl_torch.stages.train", "evaluate": "parsl_torch.stages.evaluate"}
_CREDENTIAL_VARS = ("GLOBUS_COMPUTE_CLIENT_ID", "GLOBUS_COMPUTE_CLIENT_SECRET")


def _has_login(home: Path) -> bool:
    """Tokens from an earlier interactive login (globus-compute's token store)."""
    return any((home / ".globus_compute" / name).exists() for name in ("storage.db", "credentials"))


def make_client(*, client_class: Callable[..., Any] | None = None, env: Mapping[str, str] | None = None,
                interactive: bool | None = None) -> Any:
    """A Globus Compute Client, or a ConfigError when it could only prompt with nobody there.

    ``client_class`` replaces ``globus_compute_sdk.Client`` (tests pass a mock:
    constructing the real one makes network calls).
    """
    env = os.environ if env is None else env
    interactive = sys.stdin.isatty() if interactive is None else interactive
    has_env = all(env.get(v) for v in _CREDENTIAL_VARS)
    if any(env.get(v) for v in _CREDENTIAL_VARS) and not has_env:
        missing = next(v for v in _CREDENTIAL_VARS if not env.get(v))
        raise ConfigError(f"{missing} is not set: set both {' and '.join(_CREDENTIAL_VARS)} "
                          f"for non-interactive use, or neither")
    if not (has_env or _has_login(Path(env.get("HOME", "~")).expanduser()) or interactive):
        raise ConfigError("no Globus credentials and no terminal to log in from: set "
                          f"{' and '.join(_CREDENTIAL_VARS)} (a confidential client), or run "
                          "`globus-compute-endpoint login` once in a terminal")
    if client_class is None:
        from globus_compute_sdk import Client as client_class
    return client_class()


def make_executor(endpoint_id: str, *, client: Any = None, user_endpoint_config: dict | None = None,
                  resource_specification: dict | None = None) -> Any:
    """The one place a Globus Compute Executor is built."""
    from globus_compute_sdk import Executor

    return Executor(endpoint_id=endpoint_id, client=client if client is not None else make_client(),
                    user_endpoint_config=user_endpoint_config, resource_specification=resource_specification)


def stage_command(stage: str, config: Mapping[str, Any], files: Mapping[str, str], python: str = "python") -> str:
    """The command every rank runs on the endpoint (MPIFunction adds the launcher)."""
    if stage not in STAGE_MODULES:
        raise ConfigError(f"stage {stage!r} cannot run remotely: use one of {', '.join(STAGE_MODULES)}")
    encoded = base64.b64encode(json.dumps(dict(config)).encode()).decode()
    options = " ".join(f"--{name} {_quote(path)}" for name, path in files.items())
    return f"{python} -m {STAGE_MODULES[stage]} --config-b64 {encoded} {options}"


def _quote(path: str) -> str:
    import shlex

    if "{" in path or "}" in path:
        raise ConfigError(f"remote path {path!r} contains braces, which MPIFunction formats: rename it")
    return shlex.quote(path)


def parse_result(stage: str, result: Any) -> dict[str, Any]:
    """The stage's JSON summary from a ShellResult (or its dict form), or a StageError."""
    get = result.get if isinstance(result, Mapping) else lambda k: getattr(result, k, None)
    code, stdout, stderr = get("returncode"), get("stdout") or "", get("stderr") or ""
    if code:
        tail = "\n".join(stderr.strip().splitlines()[-25:])
        raise StageError(f"stage {stage!r} failed on the endpoint with exit code {code}\n"
                         f"--- last lines of its stderr ---\n{tail}")
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise StageError(f"stage {stage!r} ended without a summary on stdout:\n{stdout[-2000:]}")


def run_stage_on_endpoint(stage: str, config: dict[str, Any], python: str, time_limit: float | None,
                          input_roles: tuple[str, ...], output_roles: tuple[str, ...],
                          inputs: tuple = (), outputs: tuple = (),
                          parsl_resource_specification: dict | None = None) -> dict[str, Any]:
    """Runs on the endpoint's MPI engine (a workflow's Parsl app): the stage on
    every rank through MPIFunction, then its summary. Files are named by role
    (``--history``, ``--checkpoint``) from the app's resolved inputs/outputs.
    ``parsl_resource_specification`` is how Parsl asks the engine for the
    stage's nodes and ranks; it reaches this function too and is not needed here."""
    from globus_compute_sdk import MPIFunction

    files = {role: os.fspath(f) for role, f in zip((*input_roles, *output_roles), (*inputs, *outputs))}
    for path in files.values():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    # (not named walltime: Parsl treats an app parameter of that name as its own)
    shell = MPIFunction(stage_command(stage, config, files, python), walltime=time_limit)
    return parse_result(stage, shell())


class RemoteStages:
    """Direct submission of built-in stages to an endpoint, without Parsl."""

    def __init__(self, executor: Any, remote_run_dir: str, python: str = "python") -> None:
        self.executor, self.remote_run_dir, self.python = executor, remote_run_dir.rstrip("/"), python
        self._lock = threading.Lock()  # resource_specification is per executor: set and submit together

    def submit(self, stage: str, config: Mapping[str, Any], files: Mapping[str, str], *,
               num_nodes: int = 1, ranks_per_node: int = 1, walltime: float | None = None) -> Future:
        """A future of the stage's summary; relative file names go under the remote run directory."""
        from globus_compute_sdk import MPIFunction

        files = {k: v if v.startswith("/") else f"{self.remote_run_dir}/{stage}/{v}" for k, v in files.items()}
        fn = MPIFunction(stage_command(stage, config, files, self.python), walltime=walltime)
        with self._lock:
            self.executor.resource_specification = {"num_nodes": num_nodes, "ranks_per_node": ranks_per_node,
                                                    "num_ranks": num_nodes * ranks_per_node}
            inner = self.executor.submit(fn)
        outer: Future = Future()

        def finish(f: Future) -> None:
            try:
                outer.set_result(parse_result(stage, f.result()))
            except BaseException as exc:  # noqa: BLE001 - hand every failure to the caller
                outer.set_exception(exc)

        inner.add_done_callback(finish)
        return outer


def versions() -> dict[str, str]:
    """What this Python has (runs on the endpoint for ``parsl-torch remote probe``)."""
    from parsl_torch.metadata import package_versions

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


def probe(executor: Any) -> tuple[dict[str, str], list[str]]:
    """Remote versions and the mismatch warnings."""
    remote = executor.submit(versions).result(timeout=600)
    return remote, compare_versions(versions(), remote)
