"""What a site file may say, and the checks that make a bad one fail clearly.

Every error names the file, the field (dotted path) and the fix; unknown
keys get a did-you-mean. Only plain data is accepted (YAML is read with the
safe loader), so no input produces anything but a ``SiteSpec`` or a
``SiteError``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from ..common.blocks import default_grace
from ..common.records import ENV_NAME, build_dataclass
from ..errors import SiteError
from ..launch.machines import MACHINES
from ..launch.schedulers import SCHEDULERS

#: Parsl's MPIExecutor ``mpi_launcher`` values (how $PARSL_MPI_PREFIX starts ranks)
MPI_LAUNCHERS = ("mpiexec", "srun", "aprun")
_WALLTIME = re.compile(r"^\d+:[0-5]\d:[0-5]\d$")
#: accounts, queues, partitions, QOS: they reach qsub/sbatch through a shell (Parsl runs them so)
_SCHEDULER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]*$")
#: an accelerator's id in a visibility variable (an index, a UUID, Aurora's tile "0.1")
_ACCELERATOR_ID = re.compile(r"^[A-Za-z0-9.:_-]+$")
#: a Slurm constraint expression (features with & | [ ] * , : and counts)
_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.&|\[\]*:,()!-]+$")


#: the local site runs stages as processes of one machine: more at once than this is a typo
MAX_LOCAL_SLOTS = 1024
#: the longest pre-flight check a site may ask for (seconds)
MAX_PREFLIGHT_S = 600


@dataclass(frozen=True)
class ProviderSpec:
    """The batch job a block runs in (Parsl's PBSProProvider / SlurmProvider)."""

    account: str | None = None  # required to render or submit
    queue: str | None = None  # PBS queue, Slurm partition
    walltime: str | None = "01:00:00"  # HH:MM:SS; null (local site only): blocks never end
    grace_period: float | None = None  # seconds before a block's end when stages checkpoint (null: default_grace)
    nodes_per_block: int = 1
    init_blocks: int = 1
    min_blocks: int = 0
    max_blocks: int = 1
    cpus_per_node: int | None = None  # PBS ncpus
    select_options: str = ""  # PBS: appended to -l select
    scheduler_options: str = ""  # extra #PBS / #SBATCH lines
    worker_init: str = ""  # shell lines run before the workers (activate the environment)
    qos: str | None = None  # Slurm
    constraint: str | None = None  # Slurm
    exclusive: bool = True  # Slurm: MPI executors need whole nodes
    #: the block's job goes on when one of its nodes dies (Slurm's --no-kill, PBS's
    #: tolerate_node_failures=all; both schedulers end it by default): spares and min_nodes need it
    survive_node_loss: bool = False


@dataclass(frozen=True)
class MPISpec:
    """Parsl's MPIExecutor: one worker per block runs multi-rank stages."""

    max_workers_per_block: int = 1  # multi-rank stages that may run at once in a block
    launcher: str = "mpiexec"  # Parsl's mpi_launcher: mpiexec | srun | aprun
    #: nodes of each block held back until a node is lost: a stage's ranks wait there from its start and take
    #: a lost node's in place (``launch.standby``)
    spare_nodes: int = 0
    #: seconds every node of a multi-node stage has to answer before the stage starts (0: no check)
    preflight: float = 0.0


@dataclass(frozen=True)
class HTEXSpec:
    """Parsl's HighThroughputExecutor for single-process work (one worker per accelerator)."""

    enabled: bool = True
    queue: str | None = None  # its own queue (default: provider.queue); Aurora's debug takes one job per user
    max_workers_per_node: int | None = None
    accelerators: tuple[str, ...] = ()  # one worker pinned to each (CUDA_VISIBLE_DEVICES, ZE_AFFINITY_MASK...)
    cpu_affinity: str = "none"
    launcher_overrides: str = ""  # extra flags for the block's launcher (MpiExecLauncher / SrunLauncher)
    nodes_per_block: int = 1
    max_blocks: int = 1


@dataclass(frozen=True)
class LaunchSpec:
    """Launch defaults for multi-rank stages (see parsl_torch.launch)."""

    ranks_per_node: int | None = None  # default: the accelerators a node has (machine record, or seen locally)
    cpu_ranks_per_node: int = 1  # where nodes have no accelerator (the local site: 2, distributed even on a laptop)
    extra_args: tuple[str, ...] | None = None  # launcher flags; default: the machine's CPU binding
    #: each node's accelerators, as the visibility variable numbers them (default: the machine record's
    #: count, or what the local site sees): stages with fewer ranks share a node, each on its own
    accelerators: tuple[str, ...] = ()


@dataclass(frozen=True)
class GlobusSpec:
    """A site reached through a Globus Compute endpoint (scheduler: globus)."""

    endpoint_id: str
    remote_run_dir: str  # where stages write on the endpoint's file system
    user_endpoint_config: Mapping[str, Any] = field(default_factory=dict)  # account, queue, walltime...
    #: the file system its stages see: the endpoint's own (None), or a name another site's may share;
    #: "local": the files of the machine the workflow runs on (an endpoint on the same cluster)
    file_system: str | None = None
    #: a second endpoint on the same file system whose engine runs small tasks at once (a ThreadPoolEngine on a
    #: login node: ``parsl-torch sites endpoint-config SITE --io``): a sweep reads its trials' histories and
    #: leaves their rulings through it when this machine cannot read the endpoint's files
    io_endpoint_id: str | None = None

    #: settings of earlier versions that decided nothing, and why (a file that sets one is refused)
    RETIRED: ClassVar[Mapping[str, str]] = MappingProxyType({
        "python": "stages run under the Python of the endpoint's engine (set it up in the endpoint's "
                  "config, e.g. worker_init); a script_app stage takes python=. Remove it",
        "max_parallel_stages": "how many stages run at once is the endpoint's (its engine's "
                               "max_workers_per_block and blocks). Remove it",
    })


@dataclass(frozen=True)
class QueueLimits:
    """What a batch queue accepts (the facility's page): a job outside them is refused when the
    config is built, not by qsub after the wait (or, worse, queued where it never starts)."""

    min_nodes: int = 1
    max_nodes: int | None = None
    max_walltime: str | None = None  # HH:MM:SS


@dataclass(frozen=True)
class SiteSpec:
    name: str
    scheduler: str
    description: str = ""
    hostnames: tuple[str, ...] = ()  # regular expressions against the hostname
    env_markers: Mapping[str, str] = field(default_factory=dict)  # variables whose values identify the machine
    machine: str | None = None  # a parsl_torch.launch.machines entry: launch defaults
    address_interface: str | None = None  # network interface workers connect back on
    environment: Mapping[str, str] = field(default_factory=dict)  # exported before the workers start
    strategy_period: float = 5.0  # seconds between Parsl's scaling decisions
    poll_period_ms: int = 10  # Parsl's HTEX poll_period: how often idle executor processes wake up
    local_slots: int = 2  # local site: multi-rank stages that may run at once
    #: a node-local directory each block of multi-rank stages copies the Python environment to (launch.nodepython)
    node_local_python: str | None = None
    provider: ProviderSpec = field(default_factory=ProviderSpec)
    mpi: MPISpec = field(default_factory=MPISpec)
    htex: HTEXSpec = field(default_factory=HTEXSpec)
    launch: LaunchSpec = field(default_factory=LaunchSpec)
    globus: GlobusSpec | None = None
    queues: Mapping[str, QueueLimits] = field(default_factory=dict)  # by queue name: checked at every build


def parse_site(data: Any, source: str) -> SiteSpec:
    """A validated SiteSpec from parsed YAML; errors say ``source: field: problem``."""
    try:
        if not isinstance(data, Mapping):
            raise SiteError(f"expected a mapping of settings at the top, got {type(data).__name__}")
        spec = build_dataclass(SiteSpec, data, "", SiteError)
    except SiteError as exc:
        raise SiteError(f"{source}: {exc}") from None
    return checked(spec, source)


def checked(spec: SiteSpec, source: str) -> SiteSpec:
    """``spec`` when its settings agree with each other (a site file's, or one changed by overrides
    through ``dataclasses.replace``); errors say ``source: field: problem``."""
    try:
        _check(spec)
    except SiteError as exc:
        raise SiteError(f"{source}: {exc}") from None
    return spec


def _check(spec: SiteSpec) -> None:
    if spec.scheduler not in SCHEDULERS:
        raise SiteError(f"scheduler: {spec.scheduler!r} is not one of {', '.join(SCHEDULERS)}")
    if spec.machine is not None and spec.machine not in MACHINES:
        raise SiteError(f"machine: {spec.machine!r} is not one of {', '.join(MACHINES)} (or leave it out)")
    for section in ("environment", "env_markers"):
        for key in getattr(spec, section):
            if not ENV_NAME.match(key):
                raise SiteError(f"{section}.{key}: not a variable name: use letters, digits and _, "
                                f"not starting with a digit")
    if SCHEDULERS[spec.scheduler].remote != (spec.globus is not None):
        raise SiteError("globus: a site needs a globus section exactly when scheduler is globus "
                        "(endpoint_id, remote_run_dir)")
    if spec.globus is not None and spec.globus.io_endpoint_id == spec.globus.endpoint_id:
        raise SiteError("globus.io_endpoint_id: the site's own endpoint, whose MPI engine runs a task only on the "
                        "nodes the trials hold: give the id of a thread-pool endpoint beside it "
                        "(parsl-torch sites endpoint-config SITE --io)")
    if spec.mpi.launcher not in MPI_LAUNCHERS:
        raise SiteError(f"mpi.launcher: {spec.mpi.launcher!r} is not one of {', '.join(MPI_LAUNCHERS)}")
    for path, value, pattern in (("provider.account", spec.provider.account, _SCHEDULER_NAME),
                                 ("provider.queue", spec.provider.queue, _SCHEDULER_NAME),
                                 ("provider.qos", spec.provider.qos, _SCHEDULER_NAME),
                                 ("htex.queue", spec.htex.queue, _SCHEDULER_NAME),
                                 ("provider.constraint", spec.provider.constraint, _CONSTRAINT)):
        if value is not None and not pattern.match(value):
            allowed = "_.@+-" if pattern is _SCHEDULER_NAME else "_.&|[]*:,()!-"
            raise SiteError(f"{path}: {value!r} is not a valid name here: use letters, digits and {allowed} "
                            f"(it reaches the scheduler's command line)")
    if "\n" in spec.provider.select_options:
        raise SiteError("provider.select_options: a newline would add a line to the batch script: keep it on "
                        "one line")
    _check_block_time(spec)
    _check_counts(spec)
    _check_launch(spec)
    _check_queues(spec)


def _check_queues(spec: SiteSpec) -> None:
    """Each queue's limits are sound, and the blocks this site submits fit the queue they go to."""
    for name, limits in spec.queues.items():
        if limits.min_nodes < 1 or limits.max_nodes is not None and limits.max_nodes < limits.min_nodes:
            raise SiteError(f"queues.{name}: min_nodes ({limits.min_nodes}) must be at least 1 and max_nodes "
                            f"({limits.max_nodes}) at least min_nodes")
        if limits.max_walltime is not None and not _WALLTIME.match(limits.max_walltime):
            raise SiteError(f"queues.{name}.max_walltime: {limits.max_walltime!r} is not HH:MM:SS")
    for path, queue, nodes in (("provider.queue", spec.provider.queue, spec.provider.nodes_per_block),
                               ("htex.queue", spec.htex.queue, spec.htex.nodes_per_block)):
        limits = spec.queues.get(queue or "")
        fits = [q for q, lim in spec.queues.items() if lim.min_nodes <= nodes <= (lim.max_nodes or nodes)
                and not (lim.max_walltime and spec.provider.walltime
                         and _seconds(spec.provider.walltime) > _seconds(lim.max_walltime))]
        if limits is None or (queue or "") in fits:
            continue
        asked = f"{nodes} node(s), walltime {spec.provider.walltime}"
        hint = f"use queue {' or '.join(fits)} (--queue), or" if fits else "ask for"
        raise SiteError(f"{path}: queue {queue!r} takes {limits.min_nodes}-{limits.max_nodes or 'any'} nodes"
                        f"{f' and at most {limits.max_walltime}' if limits.max_walltime else ''} (queues.{queue}), "
                        f"the blocks ask for {asked}: {hint} fewer nodes (--nodes) and a shorter walltime "
                        f"(--walltime)")


def _seconds(hms: str) -> int:
    hours, minutes, secs = (int(x) for x in hms.split(":"))
    return hours * 3600 + minutes * 60 + secs


def _check_counts(spec: SiteSpec) -> None:
    """Numbers of nodes, blocks, slots, spares and seconds."""
    for path, value in (("provider.nodes_per_block", spec.provider.nodes_per_block),
                        ("provider.max_blocks", spec.provider.max_blocks),
                        ("mpi.max_workers_per_block", spec.mpi.max_workers_per_block),
                        ("htex.nodes_per_block", spec.htex.nodes_per_block),
                        ("local_slots", spec.local_slots),
                        ("launch.ranks_per_node", spec.launch.ranks_per_node),
                        ("launch.cpu_ranks_per_node", spec.launch.cpu_ranks_per_node)):
        if value is not None and value < 1:
            raise SiteError(f"{path}: must be at least 1, got {value}")
    if spec.local_slots > MAX_LOCAL_SLOTS:
        raise SiteError(f"local_slots: at most {MAX_LOCAL_SLOTS} stages can run at once on one machine, got "
                        f"{spec.local_slots}: give the number of multi-rank stages this machine should run at once")
    if not 0 <= spec.mpi.spare_nodes < spec.provider.nodes_per_block:
        raise SiteError(f"mpi.spare_nodes: must be 0 or more and fewer than provider.nodes_per_block "
                        f"({spec.provider.nodes_per_block}): stages run on the others; got {spec.mpi.spare_nodes}")
    if spec.mpi.spare_nodes and not spec.provider.survive_node_loss \
            and SCHEDULERS[spec.scheduler].survive_node_loss_line:
        raise SiteError(f"mpi.spare_nodes: a spare takes over from a lost node in the same job, but {spec.scheduler} "
                        f"ends a job that loses a node: add provider.survive_node_loss: true")
    if spec.node_local_python is not None and not os.path.isabs(spec.node_local_python):
        raise SiteError(f"node_local_python: give the absolute path of a directory on each node's own storage "
                        f"(e.g. /tmp or /local/scratch), got {spec.node_local_python!r}")
    if not 0 <= spec.mpi.preflight <= MAX_PREFLIGHT_S:
        raise SiteError(f"mpi.preflight: seconds every node has to answer before a multi-node stage starts, from "
                        f"0 (no check) to {MAX_PREFLIGHT_S}; got {spec.mpi.preflight}")
    for path, value in (("provider.init_blocks", spec.provider.init_blocks),
                        ("provider.min_blocks", spec.provider.min_blocks)):
        if value < 0:
            raise SiteError(f"{path}: must be 0 or more, got {value}")


def _check_launch(spec: SiteSpec) -> None:
    """The launch section: accelerators, ranks per node."""
    ids = spec.launch.accelerators
    if len(set(ids)) != len(ids) or not all(_ACCELERATOR_ID.match(i) for i in ids):
        raise SiteError(f"launch.accelerators: each node's accelerator ids, each once, as its visibility variable "
                        f"numbers them (letters, digits, . : _ -), e.g. ['0', '1', '2', '3']; got {list(ids)}")
    if not 0 < spec.poll_period_ms <= 60_000:
        raise SiteError(f"poll_period_ms: must be > 0 and at most 60000 milliseconds, got {spec.poll_period_ms}")
    if not 0 < spec.strategy_period <= 3600:  # inf or nan would kill Parsl's strategy thread: a hang
        raise SiteError(f"strategy_period: must be > 0 and at most 3600 seconds, got {spec.strategy_period}")
    for i, pattern in enumerate(spec.hostnames):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SiteError(f"hostnames[{i}]: {pattern!r} is not a regular expression ({exc})") from None


def _check_block_time(spec: SiteSpec) -> None:
    walltime, grace = spec.provider.walltime, spec.provider.grace_period
    if walltime is None:
        if SCHEDULERS[spec.scheduler].job_id_var:
            raise SiteError(f"provider.walltime: required for scheduler {spec.scheduler} (HH:MM:SS): its batch "
                            f"jobs need a time limit")
        if grace is not None:
            raise SiteError("provider.grace_period: applies to blocks with a walltime: set provider.walltime too, "
                            "or remove it")
        return
    if not _WALLTIME.match(walltime):
        raise SiteError(f"provider.walltime: {walltime!r} is not HH:MM:SS")
    seconds = block_seconds(spec)
    if seconds is None or seconds[0] <= 0:
        raise SiteError(f"provider.walltime: {walltime!r} is no time at all: give HH:MM:SS > 0")
    if grace is not None and not 0 < grace < seconds[0]:
        raise SiteError(f"provider.grace_period: {grace:g} s must be > 0 and less than the walltime "
                        f"({seconds[0]:g} s), e.g. {default_grace(seconds[0]):.0f} (or null for that default)")


def block_seconds(spec: SiteSpec) -> tuple[float, float] | None:
    """(walltime, grace period) of a block in seconds; None when blocks have no walltime."""
    if spec.provider.walltime is None:
        return None
    walltime = float(_seconds(spec.provider.walltime))
    grace = spec.provider.grace_period
    return walltime, grace if grace is not None else default_grace(walltime)
