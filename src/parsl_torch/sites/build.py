"""A SiteSpec becomes Parsl objects here, and only when asked: constructing
Parsl's SlurmProvider runs ``sacct``, so nothing is built at import or load.

Executors: ``mpi`` (MPIExecutor: multi-rank stages, nodes handed out per task
through ``$PARSL_MPI_PREFIX``) and, where enabled, ``htex``
(HighThroughputExecutor: one worker per accelerator for single-process work).
Each has its own provider, so its own batch jobs; ``htex`` starts none until
a task needs it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..common import settings
from ..common.entrypoints import INTERCHANGE, NODE_PYTHON
from ..errors import SiteError
from ..launch.quarantine import FILE as QUARANTINE_FILE
from ..launch.schedulers import get_scheduler
from .capacity import node_accelerators, stages_at_once
from .globus import make_executor
from .schema import SiteSpec, block_seconds

MPI_LABEL, HTEX_LABEL = "mpi", "htex"


def executor_label(kind: str, site: str | None = None) -> str:
    """An executor's label: ``mpi``/``htex`` in the config of a workflow of one site; ``<site>.mpi``,
    ``<site>.htex`` where several sites share a parsl.Config, or in a config of the user's own."""
    return f"{site}.{kind}" if site else kind
# What stands in for the worker command when a batch script is only rendered
RENDER_COMMAND = "process_worker_pool.py ...  # filled in by Parsl when it submits"


def worker_init(spec: SiteSpec, python_env: str | None = None, stage_python: bool = False) -> str:
    """Shell lines run before the workers, for Parsl configs and endpoint configs
    alike: the site's ``provider.worker_init`` (the one field meant to be shell;
    ``{python_env}`` becomes ``python_env``, default the environment this
    process runs in), the site's environment (names validated, values quoted),
    and what the scheduler needs (local: the venv on PATH, a node list), after
    when the block ends (its stages checkpoint a grace period before).
    ``stage_python``: a block of multi-rank stages puts the Python environment on
    its nodes' local storage (site ``node_local_python``, ``launch.nodepython``)."""
    site_init = spec.provider.worker_init.strip().replace("{python_env}", python_env or sys.prefix)
    staged = spec.node_local_python if stage_python else None
    return "\n".join([
        *get_scheduler(spec.scheduler).worker_init(spec.local_slots),
        *block_end_lines(spec),
        *([site_init] if site_init else []),
        *(f"export {key}={shlex.quote(value)}" for key, value in spec.environment.items()),
        *([f'eval "$({shlex.quote(os.path.join(python_env or sys.prefix, "bin", "python"))} -m {NODE_PYTHON} '
           f'stage {shlex.quote(staged)})"'] if staged else []),
    ])


def block_end_lines(spec: SiteSpec) -> list[str]:
    """Export when this block ends (the scheduler's end time if it gives one, else start +
    walltime) and the grace period: every stage's supervisor reads them."""
    timing = block_seconds(spec)
    if timing is None:
        return []
    walltime, grace = timing
    start_plus = f"$(( $(date +%s) + {walltime:.0f} ))"
    end_var = get_scheduler(spec.scheduler).end_time_var
    end = f"${{{end_var}:-{start_plus}}}" if end_var else start_plus
    return [f'export {settings.BLOCK_END.name}="{end}" {settings.GRACE.name}={grace:g}']


def drain_period(spec: SiteSpec) -> int | None:
    """Seconds after its workers start when a block takes no new stage: half a grace period
    before the stages' deadline (the workers start after the block, by up to that much), so
    a stage submitted again at its deadline goes to the next block."""
    timing = block_seconds(spec)
    return None if timing is None else max(1, int(timing[0] - 1.5 * timing[1]))


#: a block whose window for new stages is shorter than this gets the start-up check below
SHORT_WINDOW_S = 60.0
#: after its pool starts, the time a block needs to register with Parsl and take a stage
TAKE_STAGE_S = 1.0


def check_blocks_take_stages(spec: SiteSpec) -> None:
    """Refuse a walltime whose blocks end before they can take a stage (Parsl would submit block
    after block forever): a block takes new stages only for ``drain_period`` seconds after its
    workers start, and a worker pool must start within them (measured here when the window is short)."""
    window = drain_period(spec)
    if window is None or window >= SHORT_WINDOW_S:
        return
    startup = pool_startup_seconds()
    if window >= startup + TAKE_STAGE_S:
        return
    walltime, grace = block_seconds(spec)  # type: ignore[misc] - a window means a walltime
    need = next((w for w in range(int(walltime) + 1, 3601) if _window(spec, w) >= startup + TAKE_STAGE_S), 3600)
    raise SiteError(f"site {spec.name!r}: walltime {spec.provider.walltime} is too short for a block to take a "
                    f"stage: a block takes new stages only in its first {window} s (the walltime less 1.5 x its "
                    f"{grace:g} s grace period), and a worker pool needs {startup:.1f} s to start here (measured) "
                    f"and about {TAKE_STAGE_S:g} s more to take a stage: use a walltime of at least "
                    f"{_hms(need)} (pt.workflow(walltime=...), PARSL_TORCH_WALLTIME or the site's provider.walltime)")


@functools.lru_cache(maxsize=1)
def pool_startup_seconds() -> float:
    """Seconds this Python takes to start and import Parsl's worker pool (what a block does first);
    measured once per process (a sweep driver starting many workflows pays it once)."""
    import subprocess
    import time

    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import parsl.executors.high_throughput.process_worker_pool"],
                   capture_output=True, timeout=600, check=False)
    return time.perf_counter() - t0


def _hms(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _window(spec: SiteSpec, walltime: int) -> int:
    longer = dataclasses.replace(spec, provider=dataclasses.replace(spec.provider, walltime=_hms(walltime)))
    return drain_period(longer) or 0


#: where a site on this machine alone (no scheduler) has its workers connect back
LOOPBACK = "127.0.0.1"


def worker_address(spec: SiteSpec) -> tuple[str, str] | None:
    """How the workers reach the interchange: ("interface", name) or ("address", LOOPBACK); None: Parsl's
    every address of the host. A site on this machine alone connects over the loopback: an address of an
    interface that goes away under a running workflow (a laptop's network changed, a bridge deleted) would
    end its pool's connection silently, the stage's result lost and the workflow waiting for the pool's
    heartbeat (ManagerLost after 120 s: the test cluster's bridge deleted under a local workflow's stage took it
    123 s instead of 14 s)."""
    if spec.address_interface:
        return ("interface", spec.address_interface)
    return ("address", LOOPBACK) if get_scheduler(spec.scheduler).one_machine else None


def interface_address(spec: SiteSpec) -> dict[str, Any]:
    """``{"address": ...}`` for the site's executors on this host (``worker_address``; {}: Parsl's choice); a
    ``SiteError`` naming the site and the fix where this host has no such interface."""
    how = worker_address(spec)
    if how is None:
        return {}
    kind, name = how
    if kind == "address":
        return {"address": name}
    from parsl.addresses import address_by_interface

    try:
        return {"address": address_by_interface(name)}
    except OSError:
        raise SiteError(f"site {spec.name!r}: network interface {spec.address_interface!r} (address_interface) "
                        f"does not exist on this host: build the config on {spec.name}'s login or compute "
                        f"nodes, or set address_interface: null") from None


def provider(spec: SiteSpec, launcher: Any, *, nodes_per_block: int, init_blocks: int, max_blocks: int,
             queue: str | None = None, stage_python: bool = False) -> Any:
    """The scheduler's Parsl provider for blocks of ``nodes_per_block`` nodes (in ``queue``, default the site's)."""
    import parsl.providers

    scheduler = get_scheduler(spec.scheduler)
    cls = getattr(parsl.providers, scheduler.parsl_provider)
    nodes = min(nodes_per_block, scheduler.max_nodes_per_block or nodes_per_block)
    provider = dataclasses.replace(spec.provider, queue=queue) if queue else spec.provider
    return cls(nodes_per_block=nodes, init_blocks=init_blocks, max_blocks=max_blocks,
               worker_init=worker_init(spec, stage_python=stage_python), launcher=launcher,
               **scheduler.provider_options(provider))


def mpi_provider(spec: SiteSpec) -> Any:
    # MPIExecutor needs SimpleLauncher: one manager per block, ranks via $PARSL_MPI_PREFIX
    timing = block_seconds(spec)
    launcher = get_scheduler(spec.scheduler).mpi_launcher(timing[0] if timing else None)
    return provider(spec, launcher, nodes_per_block=spec.provider.nodes_per_block,
                    init_blocks=spec.provider.init_blocks, max_blocks=spec.provider.max_blocks, stage_python=True)


def htex_provider(spec: SiteSpec) -> Any:
    # no block (batch job, or local worker pool) until a single-process task arrives
    launcher = get_scheduler(spec.scheduler).htex_launcher(spec.htex.launcher_overrides)
    return provider(spec, launcher, nodes_per_block=spec.htex.nodes_per_block, init_blocks=0,
                    max_blocks=spec.htex.max_blocks, queue=spec.htex.queue)


#: the executor of the apps that hand stages to warm ranks, and how many stages it holds at once
WARM_LABEL, WARM_THREADS = "warm", 256

def mpi_executor(spec: SiteSpec, label: str = MPI_LABEL, quarantine: str | None = None,
                 import_path: Sequence[str] = ()) -> Any:
    """The site's MPI executor; with ``quarantine`` (a workflow's file of lost nodes) its blocks run
    parsl-torch's worker pool, which never hands a lost node to another stage (``launch.pool``)
    and imports from ``import_path`` (the workflow's own folders)."""
    prov = mpi_provider(spec)
    extra = {"launch_cmd": pool_command(quarantine, spec, import_path)} if quarantine else {}
    max_workers = stages_at_once(spec, shared=quarantine is not None)  # (only parsl-torch's pool shares nodes)
    from .executors import SiteMPIExecutor

    # encrypted (CurveZMQ, keys per workflow in a private folder of its run directory), as Parsl's
    # HighThroughputExecutor is by default and its MPIExecutor is not: without it, anyone who reaches the
    # ports may take the stages' calls (their arguments) or answer them (a pickle the workflow loads), and
    # the interchange of a workflow killed with -9 reconnects to a new workflow that took its old ports
    return with_lean_interchange(SiteMPIExecutor(
        label=label, provider=prov, mpi_launcher=spec.mpi.launcher, max_workers_per_block=max_workers,
        poll_period=spec.poll_period_ms, drain_period=drain_period(spec), encrypted=True,
        **interface_address(spec), **extra))


def with_lean_interchange(executor: Any) -> Any:
    """``executor``, its interchange started by this Python with Parsl imported lean
    (``launch.interchange``). Set after it is made: MPIExecutor's signature types the command as one
    string, HighThroughputExecutor's as a list, and both run what the attribute holds."""
    executor.interchange_launch_cmd = [sys.executable, "-m", INTERCHANGE]
    return executor


#: parsl-torch's worker pool (``launch.pool``), installed beside Parsl's process_worker_pool.py
POOL_SCRIPT = "parsl-torch-pool"


def pool_command(quarantine: str, spec: SiteSpec, import_path: Sequence[str] = ()) -> str:
    """Parsl's worker pool command, run through ``launch.pool`` (the same arguments, Parsl's template):
    the site's spare nodes and nodes' accelerators. ``import_path``: folders its workers import from,
    so that a stage's arguments holding objects of the workflow's own modules unpickle there as they
    do in the workflow."""
    from parsl.executors.high_throughput.executor import DEFAULT_LAUNCH_CMD

    pool, _, args = DEFAULT_LAUNCH_CMD.partition(" ")
    if pool != "process_worker_pool.py":
        raise SiteError(f"this Parsl's worker pool command starts with {pool!r}, not process_worker_pool.py: "
                        f"parsl-torch cannot wrap it")
    paths = "".join(f"--path {_formatted_twice(shlex.quote(p))} " for p in import_path)
    ids, variable = node_accelerators(spec)
    shared = f"--accelerators {_formatted_twice(shlex.quote(','.join(ids)))} --visibility {variable} " if ids else ""
    if ids and spec.machine:
        shared += f"--machine {spec.machine} "
    return (f"{POOL_SCRIPT} --spares {spec.mpi.spare_nodes} {shared}{paths}"
            f"{_formatted_twice(shlex.quote(quarantine))} -- {args}")


def _formatted_twice(text: str) -> str:
    """``text`` as it must stand in a launch command that Parsl formats twice (``str.format``: at the
    executor's start and per block) to come out as itself."""
    return text.replace("{", "{{{{").replace("}", "}}}}")


def htex_executor(spec: SiteSpec, label: str = HTEX_LABEL) -> Any:
    h = spec.htex
    optional = {"available_accelerators": list(h.accelerators), "max_workers_per_node": h.max_workers_per_node}
    kwargs: dict[str, Any] = {"cpu_affinity": h.cpu_affinity, "prefetch_capacity": 0,
                              "poll_period": spec.poll_period_ms, "drain_period": drain_period(spec),
                              **{k: v for k, v in optional.items() if v}}  # (each only where set)
    from .executors import SiteHighThroughputExecutor

    return with_lean_interchange(SiteHighThroughputExecutor(label=label, provider=htex_provider(spec), **kwargs,
                                                            **interface_address(spec)))


def site_executors(spec: SiteSpec, site: str | None = None, quarantine: str | None = None,
                   import_path: Sequence[str] = ()) -> list[Any]:
    """The site's executors, labelled by ``executor_label`` (``site``: the name that lets several
    sites' executors sit in one parsl.Config)."""
    mpi = mpi_executor(spec, executor_label(MPI_LABEL, site), quarantine, import_path)
    htex = htex_executor(spec, executor_label(HTEX_LABEL, site)) if spec.htex.enabled else None
    mpi.single_process = htex
    if htex is not None:
        htex.multi_process = mpi
    return [mpi, *([htex] if htex else [])]


def require_account(spec: SiteSpec, action: str) -> None:
    if "account" in get_scheduler(spec.scheduler).provider_options(spec.provider) and not spec.provider.account:
        raise SiteError(f"site {spec.name!r}: provider.account is required to {action}: pass --account / "
                        f"account=..., set PARSL_TORCH_ACCOUNT, or put it in the site file")


def globus_executor(spec: SiteSpec, gc_executor: Any = None, label: str = MPI_LABEL) -> Any:
    """Parsl's GlobusComputeExecutor around a Globus Compute Executor for the site's endpoint
    (``gc_executor`` replaces it, e.g. in tests)."""
    from parsl.executors import GlobusComputeExecutor

    g = spec.globus
    executor = gc_executor or make_executor(g.endpoint_id, user_endpoint_config=dict(g.user_endpoint_config))
    return GlobusComputeExecutor(executor=executor, label=label)


def workflow_config(specs: list[SiteSpec], run_dir: str | os.PathLike, gc_executor: Any = None,
                    warm: bool = False, import_path: Sequence[str] = (), **config_kwargs: Any) -> Any:
    """One parsl.Config for a workflow's sites: one site's executors are labelled ``mpi``/``htex``,
    several sites' ``<site>.mpi``/``<site>.htex``. ``gc_executor`` serves the Globus Compute sites;
    ``warm``: a thread executor for the apps that hand stages to warm ranks (``apps.warm``);
    ``import_path``: the workflow's own folders, which its worker pools import from."""
    from parsl.config import Config
    from parsl.executors import ThreadPoolExecutor

    prefixed = len(specs) > 1
    executors = []
    for spec in specs:
        require_account(spec, "submit jobs")
        site = spec.name if prefixed else None
        if get_scheduler(spec.scheduler).remote:
            executors.append(globus_executor(spec, gc_executor, executor_label(MPI_LABEL, site)))
        else:
            executors += site_executors(spec, site, str(Path(run_dir) / QUARANTINE_FILE), import_path)
    if warm:  # each thread waits for one stage's call in its warm ranks
        executors.append(ThreadPoolExecutor(label=WARM_LABEL, max_threads=WARM_THREADS))
    options = {"usage_tracking": 0, "strategy_period": min(s.strategy_period for s in specs), **config_kwargs}
    return Config(executors=executors, run_dir=str(run_dir), **options)


def render(spec: SiteSpec, executor: str = MPI_LABEL) -> str:
    """The batch script Parsl would submit for one block of ``executor``; nothing is submitted."""
    require_account(spec, "render a batch script")
    if not get_scheduler(spec.scheduler).job_id_var:
        raise SiteError(f"site {spec.name!r} submits no batch script of its own ({spec.scheduler}): "
                        f"nothing to render")
    if executor not in (MPI_LABEL, HTEX_LABEL):
        raise SiteError(f"executor {executor!r} is unknown: use {MPI_LABEL!r} or {HTEX_LABEL!r}")
    prov = mpi_provider(spec) if executor == MPI_LABEL else htex_provider(spec)
    submitted: list[str] = []

    def not_submitted(cmd: str, timeout: float | None = None) -> tuple[int, str, str]:
        # the provider's public command runner, standing in for qsub/sbatch
        submitted.append(cmd)
        return 0, "Submitted batch job 0\n", ""

    with tempfile.TemporaryDirectory() as tmp:
        prov.script_dir = tmp
        prov.execute_wait = not_submitted
        prov.submit(RENDER_COMMAND, tasks_per_node=1, job_name=f"parsl.{executor}.block-0")
        scripts = [f for f in Path(tmp).iterdir() if f.is_file()]
        if len(submitted) != 1 or len(scripts) != 1:
            raise SiteError(f"site {spec.name!r}: Parsl's {type(prov).__name__} did not write one batch script "
                            f"(got {len(scripts)}): this Parsl version renders differently")
        command = submitted[0].replace(tmp, "<script_dir>")
        script = scripts[0].read_text().replace(tmp, "<script_dir>")
    return f"# Parsl would submit this with: {command}\n{script}"
