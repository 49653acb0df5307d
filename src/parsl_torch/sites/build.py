"""A SiteSpec becomes Parsl objects here, and only when asked: constructing
Parsl's SlurmProvider runs ``sacct``, so nothing is built at import or load.

Executors: ``mpi`` (MPIExecutor: multi-rank stages, nodes handed out per task
through ``$PARSL_MPI_PREFIX``) and, where enabled, ``htex``
(HighThroughputExecutor: one worker per accelerator for single-process work).
Each has its own provider, so its own batch jobs; ``htex`` starts none until
a task needs it.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import SiteError
from .schema import SiteSpec

MPI_LABEL, HTEX_LABEL = "mpi", "htex"
# What stands in for the worker command when a batch script is only rendered
RENDER_COMMAND = "process_worker_pool.py ...  # filled in by Parsl when it submits"


def worker_init(spec: SiteSpec) -> str:
    """Shell lines run before the workers: the site's (``{python_env}`` becomes
    the environment this process runs in), its environment variables, and for
    the local site the venv on PATH and a node list for Parsl's MPI mode."""
    site_init = spec.provider.worker_init.strip().replace("{python_env}", sys.prefix)
    lines = [site_init] if site_init else []
    lines += [f"export {key}={shlex.quote(value)}" for key, value in spec.environment.items()]
    if spec.scheduler == "local":
        # Parsl starts workers by name: this Python's bin must come first
        lines.insert(0, f'export PATH={shlex.quote(str(Path(sys.executable).parent))}:"$PATH"')
        # Parsl's MPI mode takes the block's nodes from PBS_NODEFILE (or Slurm);
        # without a scheduler there is none: list this host once per slot
        lines.append('export PBS_NODEFILE="$(mktemp -t parsl-torch-nodes.XXXXXX)"; '
                     f'for _ in $(seq {spec.local_slots}); do hostname >> "$PBS_NODEFILE"; done')
    return "\n".join(lines)


def _address(spec: SiteSpec) -> dict[str, Any]:
    if not spec.address_interface:
        return {}
    from parsl.addresses import address_by_interface

    try:
        return {"address": address_by_interface(spec.address_interface)}
    except OSError:
        raise SiteError(f"site {spec.name!r}: network interface {spec.address_interface!r} (address_interface) "
                        f"does not exist on this host: build the config on {spec.name}'s login or compute "
                        f"nodes, or set address_interface: null") from None


def provider(spec: SiteSpec, launcher: Any, *, nodes_per_block: int, init_blocks: int,
             max_blocks: int) -> Any:
    p = spec.provider
    init = worker_init(spec)
    if spec.scheduler == "pbs":
        from parsl.providers import PBSProProvider

        return PBSProProvider(account=p.account, queue=p.queue, walltime=p.walltime,
                              nodes_per_block=nodes_per_block, init_blocks=init_blocks,
                              min_blocks=p.min_blocks, max_blocks=max_blocks,
                              cpus_per_node=p.cpus_per_node or 1, select_options=p.select_options,
                              scheduler_options=p.scheduler_options, worker_init=init, launcher=launcher)
    if spec.scheduler == "slurm":
        from parsl.providers import SlurmProvider

        return SlurmProvider(partition=p.queue, account=p.account, qos=p.qos, constraint=p.constraint,
                             walltime=p.walltime, nodes_per_block=nodes_per_block, init_blocks=init_blocks,
                             min_blocks=p.min_blocks, max_blocks=max_blocks, exclusive=p.exclusive,
                             scheduler_options=p.scheduler_options, worker_init=init, launcher=launcher)
    from parsl.providers import LocalProvider

    return LocalProvider(nodes_per_block=1, init_blocks=init_blocks, min_blocks=0, max_blocks=max_blocks,
                         worker_init=init, launcher=launcher)


def _htex_launcher(spec: SiteSpec) -> Any:
    from parsl.launchers import MpiExecLauncher, SingleNodeLauncher, SrunLauncher

    overrides = spec.htex.launcher_overrides
    if spec.scheduler == "pbs":
        return MpiExecLauncher(bind_cmd="--cpu-bind", overrides=overrides)
    if spec.scheduler == "slurm":
        return SrunLauncher(overrides=overrides)
    return SingleNodeLauncher()


def mpi_provider(spec: SiteSpec) -> Any:
    from parsl.launchers import SimpleLauncher

    # MPIExecutor needs SimpleLauncher: one manager per block, ranks via $PARSL_MPI_PREFIX
    return provider(spec, SimpleLauncher(), nodes_per_block=spec.provider.nodes_per_block,
                    init_blocks=spec.provider.init_blocks, max_blocks=spec.provider.max_blocks)


def htex_provider(spec: SiteSpec) -> Any:
    # no block (batch job, or local worker pool) until a single-process task arrives
    return provider(spec, _htex_launcher(spec), nodes_per_block=spec.htex.nodes_per_block,
                    init_blocks=0, max_blocks=spec.htex.max_blocks)


def mpi_executor(spec: SiteSpec) -> Any:
    from parsl.executors import MPIExecutor

    prov = mpi_provider(spec)
    max_workers = spec.local_slots if spec.scheduler == "local" else spec.mpi.max_workers_per_block
    return MPIExecutor(label=MPI_LABEL, provider=prov, mpi_launcher=spec.mpi.launcher,
                       max_workers_per_block=max_workers, poll_period=spec.poll_period_ms, **_address(spec))


def htex_executor(spec: SiteSpec) -> Any:
    from parsl.executors import HighThroughputExecutor

    h = spec.htex
    kwargs: dict[str, Any] = {"cpu_affinity": h.cpu_affinity, "prefetch_capacity": 0,
                              "poll_period": spec.poll_period_ms}
    if h.accelerators:
        kwargs["available_accelerators"] = list(h.accelerators)
    if h.max_workers_per_node:
        kwargs["max_workers_per_node"] = h.max_workers_per_node
    return HighThroughputExecutor(label=HTEX_LABEL, provider=htex_provider(spec), **kwargs, **_address(spec))


def require_account(spec: SiteSpec, action: str) -> None:
    if spec.scheduler in ("pbs", "slurm") and not spec.provider.account:
        raise SiteError(f"site {spec.name!r}: provider.account is required to {action}: pass --account / "
                        f"account=..., set PARSL_TORCH_ACCOUNT, or put it in the site file")


def globus_executor(spec: SiteSpec, gc_executor: Any = None) -> Any:
    """Parsl's GlobusComputeExecutor (label ``mpi``) around a Globus Compute
    Executor for the site's endpoint (``gc_executor`` replaces it, e.g. in tests)."""
    from parsl.executors import GlobusComputeExecutor

    from ..remote import make_executor

    g = spec.globus
    executor = gc_executor or make_executor(g.endpoint_id, user_endpoint_config=dict(g.user_endpoint_config))
    return GlobusComputeExecutor(executor=executor, label=MPI_LABEL)


def parsl_config(spec: SiteSpec, run_dir: str | os.PathLike, gc_executor: Any = None,
                 **config_kwargs: Any) -> Any:
    """A parsl.Config for this site (usage tracking off)."""
    from parsl.config import Config

    require_account(spec, "submit jobs")
    if spec.scheduler == "globus":
        executors = [globus_executor(spec, gc_executor)]
    else:
        executors = [mpi_executor(spec)]
    if spec.htex.enabled and spec.scheduler != "globus":
        executors.append(htex_executor(spec))
    return Config(executors=executors, run_dir=str(run_dir), usage_tracking=0,
                  strategy_period=spec.strategy_period, **config_kwargs)


def render(spec: SiteSpec, executor: str = MPI_LABEL) -> str:
    """The batch script Parsl would submit for one block of ``executor``; nothing is submitted."""
    require_account(spec, "render a batch script")
    if spec.scheduler in ("local", "globus"):
        raise SiteError(f"site {spec.name!r} submits no batch script of its own ({spec.scheduler}): "
                        f"nothing to render")
    if executor not in (MPI_LABEL, HTEX_LABEL):
        raise SiteError(f"executor {executor!r} is unknown: use {MPI_LABEL!r} or {HTEX_LABEL!r}")
    prov = mpi_provider(spec) if executor == MPI_LABEL else htex_provider(spec)
    captured: dict[str, str] = {}
    write = prov._write_submit_script

    def capture(template, script_filename, job_name, configs):
        write(template, script_filename, job_name, configs)
        captured["script"] = Path(script_filename).read_text()

    def not_submitted(cmd, timeout=None):  # stands in for qsub/sbatch
        captured["command"] = cmd
        return 0, "Submitted batch job 0\n", ""

    with tempfile.TemporaryDirectory() as tmp:
        prov.script_dir = tmp
        prov._write_submit_script = capture
        prov.execute_wait = not_submitted
        prov.submit(RENDER_COMMAND, tasks_per_node=1, job_name=f"parsl.{executor}.block-0")
        command = captured["command"].replace(tmp, "<script_dir>")
        script = captured["script"].replace(tmp, "<script_dir>")
    return f"# Parsl would submit this with: {command}\n{script}"
