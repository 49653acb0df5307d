"""Globus Compute: the stages of a workflow on Aurora, Polaris or Frontier from a
laptop or login node, without SSH.

A stage on a Globus Compute site is one task (``apps.remote.job.run_job``) on the
endpoint's MPI engine, with the stage's nodes and ranks as its resource
specification. The job carries the stage's function (by value when it is
defined in the workflow script, as for a local stage), the code components of
its identity read here, and the user modules it reaches; the endpoint
completes the identity, skips the stage when its directory holds the same
call's files, else launches it as a local stage is launched. A script stage
names a script on the endpoint's file system. Files stay there (under the
site's ``remote_run_dir``/<run directory's name>/<stage>); the answer is rank 0's
return value or the stage's error. Clients and executors are built by
``parsl_torch.sites.globus`` (credentials checked there).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...common.metadata import package_versions
from ...errors import ConfigError
from ...sites.globus import make_client, make_executor
from .. import identity
from ..stage.call import StageCall
from ..stage.options import ShippedFunction
from .job import RemoteAnswer, RemoteJob, run_job

if TYPE_CHECKING:
    from ..session.workflow import Workflow

__all__ = ["RemoteAnswer", "RemoteJob", "compare_versions", "make_client", "make_executor", "probe", "remote_job",
           "submit_remote", "versions"]

#: the most user-module source a job carries (Globus Compute refuses tasks over 10 MB)
SOURCES_LIMIT = 4 * 1024 * 1024


def remote_job(call: StageCall, fn: Callable | None, python: str | None, digests: identity.DigestCache,
               memoize: bool) -> RemoteJob:
    """A stage call packed for the endpoint. A function's code components are read here, where its code
    is, and the user modules it reaches travel with it; a script's are read on the endpoint."""
    there = replace(call, opts=replace(call.opts, import_path=()))  # the endpoint's is its own (and the shipped)
    if fn is None:
        return RemoteJob(there, python, memoize=memoize)
    code = identity.code_components(call.opts, digests)
    digests.save()
    sources = _sources([key[len("module "):] for key in code if key.startswith("module ")], call.opts.import_path,
                       call.stage)
    return RemoteJob(replace(there, fn=ShippedFunction.of(fn)), code=tuple(sorted(code.items())), sources=sources,
                     memoize=memoize)


def _sources(paths: Sequence[str], import_path: Sequence[str], stage: str) -> tuple[tuple[str, bytes], ...]:
    """Each user module as (its path under the import root it is found in, its source)."""
    roots = sorted((os.path.realpath(r) for r in import_path), key=len, reverse=True)
    shipped, size = [], 0
    for path in sorted(paths):
        root = next((r for r in roots if Path(path).is_relative_to(r)), None)
        if root is None:
            continue  # not importable from the workflow's folders: the endpoint must have it
        source = Path(path).read_bytes()
        size += len(source)
        shipped.append((os.path.relpath(path, root), source))
    if size > SOURCES_LIMIT:
        raise ConfigError(f"stage {stage!r}: the user modules it reaches hold {size / 2**20:.1f} MiB of source, "
                          f"more than a Globus Compute task carries ({SOURCES_LIMIT // 2**20} MiB here): install "
                          f"your package on the endpoint (pip install it into the endpoint's environment)")
    return tuple(shipped)


@functools.lru_cache(maxsize=None)
def _job_app(label: str):
    from parsl import python_app

    return python_app(run_job, executors=[label], cache=False)  # the endpoint decides what is skipped


def submit_remote(wf: Workflow, job: RemoteJob, args: tuple, kwargs: Mapping[str, Any], inputs: Sequence,
                  outputs: Sequence) -> Any:
    """The job as one task on the endpoint of its call's executor in workflow ``wf``; its AppFuture (of a
    RemoteAnswer). The call's own arguments travel beside the job, so Parsl resolves the futures among
    them first."""
    future = _job_app(job.call.executor)(job, *args, inputs=list(inputs), outputs=list(outputs),
                                         parsl_resource_specification=job.call.resource_specification, **kwargs)
    future.add_done_callback(functools.partial(_say_why, wf.log, job.stage))
    return future


def _say_why(log: Any, stage: str, future: Any) -> None:
    """Why a stage ran (a skipped one is said by the workflow, as a local one is)."""
    if future.exception() is None and isinstance(answer := future.result(), RemoteAnswer) and answer.ran:
        log.info("[%s] ran on the endpoint: %s", stage, answer.ran)


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
