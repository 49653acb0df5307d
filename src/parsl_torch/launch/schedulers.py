"""One record per scheduler: everything parsl-torch needs to know about a
batch system, in one class that is mostly data.

In the spirit of dask-jobqueue's ``SLURMJob`` (a scheduler described by class
attributes) and Parsl's one-method ``Launcher``: a record names its job-id
variable, the programs that start ranks under it, its Parsl provider and its
Globus Compute endpoint provider, and implements the few things that differ
(the job's nodes, the rank launch command, the provider's options). Launch,
detection, site files, Parsl configs, endpoint configs and the CLI all read
``SCHEDULERS``; adding a scheduler is one record passed to ``register`` (a
worked example is in docs/architecture.md).

Detection order: ``PARSL_TORCH_SCHEDULER``, then each record's job-id
variable in registration order (``PBS_JOBID`` before ``SLURM_JOB_ID``), then
the scheduler of the machine the site files name for this host (outside a
job), then local. Installed binaries are never evidence: a laptop with
``sbatch`` on PATH is still local.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..common import settings
from ..common.environ import find_local_tool, python_bin
from ..core.topology import expand_hostlist
from ..errors import ConfigError
from .machines import Machine, get_machine


@dataclass(frozen=True)
class RankLaunch:
    """How a scheduler starts the ranks: argv before the rank command, the
    program's name, and variables for the launcher's environment."""

    argv: tuple[str, ...]
    program: str  # mpiexec | srun | torchrun
    env: dict[str, str] = field(default_factory=dict)


class Scheduler:
    """A batch system. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    #: set inside a job of this scheduler (None: never "in a job")
    job_id_var: ClassVar[str | None] = None
    #: programs that start ranks here; the first is the default
    launchers: ClassVar[tuple[str, ...]] = ()
    #: the class in ``parsl.providers`` that submits its blocks (None: no batch jobs of its own)
    parsl_provider: ClassVar[str | None] = None
    #: the provider ``type`` in a Globus Compute endpoint config (None: cannot host an endpoint)
    endpoint_provider: ClassVar[str | None] = None
    #: nodes one block can have (None: what the site asks for)
    max_nodes_per_block: ClassVar[int | None] = None

    @property
    def one_machine(self) -> bool:
        """Its stages run as processes of this machine alone (the local site)."""
        return self.max_nodes_per_block == 1
    #: stages run through a Globus Compute endpoint, not on this machine
    remote: ClassVar[bool] = False
    #: set inside a job to the epoch seconds it ends (None: the job's start + walltime tells)
    end_time_var: ClassVar[str | None] = None
    #: the batch script's line that keeps a job running when one of its nodes dies (the scheduler's
    #: default ends it); None: its jobs are not ended so, or it has none
    survive_node_loss_line: ClassVar[str | None] = None

    def scheduler_options(self, provider: Any) -> str:
        """The site's extra batch-script lines, with the one that keeps its jobs through a lost node
        where the site asks for it (``provider.survive_node_loss``)."""
        lines = [provider.scheduler_options] if provider.scheduler_options else []
        if provider.survive_node_loss and self.survive_node_loss_line:
            lines.append(self.survive_node_loss_line)
        return "\n".join(lines)

    def job_nodes(self, env: Mapping[str, str]) -> tuple[str, ...]:
        """The job's nodes in order, deduplicated; a ConfigError if there is no job."""
        raise ConfigError(f"scheduler {self.name!r} has no nodes to launch on here")

    def job_ranks_per_node(self, env: Mapping[str, str]) -> int | None:
        """Ranks per node the job itself asked for (None: it did not say)."""
        return None

    def rank_launch(self, program: str | None, num_nodes: int, ranks_per_node: int, num_ranks: int,
                    nodes: Sequence[str], machine: Machine | None, env: Mapping[str, str]) -> RankLaunch:
        """The launch command for the ranks, before the command each rank runs.
        ``program``: the launcher the user asked for (one of ``launchers``), None for the default."""
        raise ConfigError(f"scheduler {self.name!r} starts no ranks on this machine")

    def provider_options(self, provider: Any) -> dict[str, Any]:
        """This scheduler's keyword arguments for its provider, from a site's
        ``provider`` section (for the Parsl provider and the endpoint config alike)."""
        return {}

    def mpi_launcher(self, walltime_s: float | None) -> Any:
        """The Parsl launcher of an MPI executor's block (MPIExecutor requires a SimpleLauncher):
        the scheduler ends the block at its walltime."""
        from parsl.launchers import SimpleLauncher

        return SimpleLauncher()

    def htex_launcher(self, overrides: str) -> Any:
        """The Parsl launcher that starts one HTEX manager per node of a block."""
        from parsl.launchers import SingleNodeLauncher

        return SingleNodeLauncher()

    def worker_init(self, local_slots: int) -> list[str]:
        """Shell lines this scheduler needs before Parsl's workers start."""
        return []


class PBS(Scheduler):
    """PBS Pro (Aurora, Polaris): ranks by PALS/MPICH ``mpiexec`` over the job's node file."""

    name = "pbs"
    job_id_var = "PBS_JOBID"
    launchers = ("mpiexec",)
    parsl_provider = "PBSProProvider"
    endpoint_provider = "PBSProProvider"
    # PBS Pro's job attribute (default "none": a failed sister node ends the job)
    survive_node_loss_line = "#PBS -W tolerate_node_failures=all"

    def job_nodes(self, env: Mapping[str, str]) -> tuple[str, ...]:
        nodefile = env.get("PBS_NODEFILE")
        if not nodefile:
            raise ConfigError("PBS_NODEFILE is not set: launch inside a PBS job (qsub -I or a batch script)")
        try:
            lines = Path(nodefile).read_text().split()
        except OSError as exc:
            raise ConfigError(f"PBS_NODEFILE={nodefile} cannot be read: {exc.strerror}") from None
        if not lines:
            raise ConfigError(f"PBS_NODEFILE={nodefile} is empty: the job has no nodes")
        return tuple(dict.fromkeys(lines))

    def job_ranks_per_node(self, env: Mapping[str, str]) -> int | None:
        # PBS writes a node once per mpiprocs of its select chunk
        lines = self.job_nodes(env) and Path(env["PBS_NODEFILE"]).read_text().split()
        return lines.count(lines[0]) if lines else None

    def rank_launch(self, program, num_nodes, ranks_per_node, num_ranks, nodes, machine, env):
        mpiexec = settings.MPIEXEC.get(env) or shutil.which("mpiexec")
        if not mpiexec:
            raise ConfigError("mpiexec is not on PATH: load the MPI module (module load ...) "
                              "or set PARSL_TORCH_MPIEXEC")
        binding = machine.binding_args(ranks_per_node) if machine else []
        # --line-buffer is PALS's (Aurora, Polaris); MPICH's hydra refuses it and buffers by line anyway
        line_buffer = () if is_hydra(mpiexec) else ("--line-buffer",)
        argv = (mpiexec, "--envall", "--np", str(num_ranks), "--ppn", str(ranks_per_node),
                "--hostfile", _hostfile(nodes, env["PBS_NODEFILE"]), *line_buffer, *binding)
        # mpiexec places rank 0 on the host file's first node
        return RankLaunch(argv, "mpiexec", {"MASTER_ADDR": nodes[0]})

    def provider_options(self, provider: Any) -> dict[str, Any]:
        p = provider
        return {"account": p.account, "queue": p.queue, "walltime": p.walltime, "min_blocks": p.min_blocks,
                "cpus_per_node": p.cpus_per_node or 1, "select_options": p.select_options,
                "scheduler_options": self.scheduler_options(p)}

    def htex_launcher(self, overrides: str) -> Any:
        from parsl.launchers import MpiExecLauncher

        return MpiExecLauncher(bind_cmd="--cpu-bind", overrides=overrides)


class Slurm(Scheduler):
    """Slurm (Frontier, Perlmutter, any cluster): ranks by ``srun`` inside the allocation."""

    name = "slurm"
    job_id_var = "SLURM_JOB_ID"
    launchers = ("srun",)
    parsl_provider = "SlurmProvider"
    endpoint_provider = "SlurmProvider"
    end_time_var = "SLURM_JOB_END_TIME"  # Slurm 23.02 and later
    survive_node_loss_line = "#SBATCH --no-kill"  # (default: a node that fails ends the job)

    def job_nodes(self, env: Mapping[str, str]) -> tuple[str, ...]:
        hostlist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not hostlist:
            raise ConfigError("SLURM_JOB_NODELIST is not set: launch inside a Slurm job (salloc or sbatch)")
        return tuple(expand_hostlist(hostlist))

    def job_ranks_per_node(self, env: Mapping[str, str]) -> int | None:
        value = env.get("SLURM_NTASKS_PER_NODE", "")  # set by --ntasks-per-node
        return int(value) if value.isdigit() else None

    def rank_launch(self, program, num_nodes, ranks_per_node, num_ranks, nodes, machine, env):
        if not shutil.which("srun"):
            raise ConfigError("srun is not on PATH inside a Slurm job: check the Slurm installation")
        binding = machine.binding_args(ranks_per_node) if machine else []
        # rank 0 runs on the step's first node: the shim reads it from SLURM_STEP_NODELIST
        return RankLaunch(("srun", "--nodes", str(num_nodes), "--ntasks", str(num_ranks), "--ntasks-per-node",
                           str(ranks_per_node), "--kill-on-bad-exit=1", *binding), "srun")

    def provider_options(self, provider: Any) -> dict[str, Any]:
        p = provider
        return {"account": p.account, "partition": p.queue, "qos": p.qos, "constraint": p.constraint,
                "walltime": p.walltime, "min_blocks": p.min_blocks, "exclusive": p.exclusive,
                "scheduler_options": self.scheduler_options(p)}

    def htex_launcher(self, overrides: str) -> Any:
        from parsl.launchers import SrunLauncher

        return SrunLauncher(overrides=overrides)


class Local(Scheduler):
    """No scheduler: this host only, ranks by the venv's ``mpiexec`` or ``torchrun``."""

    name = "local"
    launchers = ("mpiexec", "torchrun")
    parsl_provider = "LocalProvider"
    endpoint_provider = "LocalProvider"  # an endpoint on this machine (parsl-torch endpoint test local)
    max_nodes_per_block = 1

    def job_nodes(self, env: Mapping[str, str]) -> tuple[str, ...]:
        return ("localhost",)

    def rank_launch(self, program, num_nodes, ranks_per_node, num_ranks, nodes, machine, env):
        mpiexec = None if program == "torchrun" else (settings.MPIEXEC.get(env) or find_local_tool("mpiexec"))
        master = {"MASTER_ADDR": "127.0.0.1"}
        if mpiexec:
            return RankLaunch((mpiexec, "-n", str(num_ranks)), "mpiexec", master)
        if program == "mpiexec":
            raise ConfigError("--launcher mpiexec: no mpiexec beside this Python or on PATH: "
                              "pip install 'parsl-torch[mpi]'")
        torchrun = find_local_tool("torchrun")
        if not torchrun:
            raise ConfigError("no launcher found: pip install 'parsl-torch[mpi]' for mpiexec, "
                              "or put torchrun on PATH")
        return RankLaunch((torchrun, "--standalone", f"--nproc-per-node={num_ranks}", "--no-python"),
                          "torchrun", master)

    def provider_options(self, provider: Any) -> dict[str, Any]:
        return {"min_blocks": 0}

    def mpi_launcher(self, walltime_s: float | None) -> Any:
        # no scheduler ends a local block: `timeout` does, as a batch job's time limit would
        # (SIGTERM, then SIGKILL 10 s later); supervisors stop their ranks on the SIGTERM
        return _timeout_launcher(walltime_s) if walltime_s else super().mpi_launcher(None)

    def worker_init(self, local_slots: int) -> list[str]:
        # Parsl starts workers by name: this Python's bin must come first. Parsl's
        # MPI mode takes a block's nodes from PBS_NODEFILE (or Slurm); without a
        # scheduler there is none: list this host once per slot, in a file beside the
        # block's submit script (in the run directory: nothing left in /tmp)
        return [f'export PATH={shlex.quote(str(python_bin()))}:"$PATH"',
                'export PBS_NODEFILE="$(readlink -f "$0").nodes"; : > "$PBS_NODEFILE"; '
                f'for _ in $(seq {local_slots}); do hostname >> "$PBS_NODEFILE"; done']


class Globus(Scheduler):
    """A Globus Compute endpoint: stages run on the endpoint's machine, which has its own scheduler."""

    name = "globus"
    remote = True


def _timeout_launcher(walltime_s: float) -> Any:
    from parsl.launchers import SimpleLauncher

    class TimeoutLauncher(SimpleLauncher):
        """SimpleLauncher (MPIExecutor checks for it) whose block ends after the walltime."""

        def __call__(self, command: str, tasks_per_node: int, nodes_per_block: int, script_dir: str = "") -> str:
            return f"timeout --kill-after=10 {walltime_s:.0f} {super().__call__(command, tasks_per_node, 1)}"

    return TimeoutLauncher()


SCHEDULERS: dict[str, Scheduler] = {}


def register(scheduler: Scheduler) -> Scheduler:
    """Make ``scheduler`` known to detection, launch, site files and the CLI; returns it."""
    if not getattr(scheduler, "name", ""):
        raise ConfigError(f"{type(scheduler).__name__}: a scheduler record needs a name")
    SCHEDULERS[scheduler.name] = scheduler
    return scheduler


for _record in (PBS(), Slurm(), Local(), Globus()):
    register(_record)


def get_scheduler(name: str) -> Scheduler:
    if name not in SCHEDULERS:
        raise ConfigError(f"scheduler {name!r} is unknown: use one of {', '.join(SCHEDULERS)}")
    return SCHEDULERS[name]


def all_launchers() -> tuple[str, ...]:
    """Every program some scheduler starts ranks with (the CLI's --launcher choices)."""
    return tuple(dict.fromkeys(p for s in SCHEDULERS.values() for p in s.launchers))


@dataclass(frozen=True)
class Detection:
    scheduler: str  # a SCHEDULERS key
    machine: str | None  # a MACHINES key
    in_job: bool
    reason: str


def detect_scheduler(env: Mapping[str, str] | None = None, *, machine: str | None = None,
                     machine_scheduler: str | None = None, why: str = "") -> Detection:
    """The scheduler this process runs under, and its machine.

    ``machine``/``machine_scheduler``/``why``: what the site files say about
    this host (``sites.detect_job`` passes them); ``PARSL_TORCH_MACHINE``
    overrides the machine.
    """
    env = os.environ if env is None else env
    forced_machine = settings.MACHINE.get(env)
    if forced_machine:
        try:
            get_machine(forced_machine)
        except ConfigError as exc:
            raise ConfigError(f"PARSL_TORCH_MACHINE: {exc}") from None
        machine, why = forced_machine, f"PARSL_TORCH_MACHINE={forced_machine}"
    forced = settings.SCHEDULER.get(env) or ""
    if forced:
        launchable = [n for n, s in SCHEDULERS.items() if s.launchers]
        if forced not in launchable:
            raise ConfigError(f"PARSL_TORCH_SCHEDULER={forced!r} is unknown: use one of {', '.join(launchable)}")
        record = SCHEDULERS[forced]
        in_job = record.job_id_var is None or record.job_id_var in env
        return Detection(forced, machine, in_job, f"PARSL_TORCH_SCHEDULER={forced}")
    for record in SCHEDULERS.values():
        if record.job_id_var and env.get(record.job_id_var):
            return Detection(record.name, machine, True, f"{record.name.upper()} job {env[record.job_id_var]}")
    if machine_scheduler in SCHEDULERS and SCHEDULERS[machine_scheduler].job_id_var:
        return Detection(machine_scheduler, machine, False, f"{why}, outside a job")
    reason = f"no {' or '.join(s.job_id_var for s in SCHEDULERS.values() if s.job_id_var)}"
    return Detection("local", machine, True, f"{reason}; {why}" if why else reason)


@functools.lru_cache(maxsize=8)
def is_hydra(mpiexec: str) -> bool:
    """Whether ``mpiexec`` is MPICH's hydra (a PBS cluster without PALS, or the test cluster)."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "HYDRA" in out


#: the host files this process wrote for its launches, removed when it exits (one per stage on a block's
#: nodes would pile up in a node's /tmp); a dry run keeps them (``keep_host_files``): its command names them
_HOST_FILES: list[str] = []


def _remove_host_files() -> None:
    for path in _HOST_FILES:
        with contextlib.suppress(OSError):
            os.unlink(path)


def keep_host_files() -> None:
    _HOST_FILES.clear()


def _hostfile(nodes: Sequence[str], nodefile: str) -> str:
    """PBS_NODEFILE itself when it already lists exactly these nodes once each."""
    if Path(nodefile).read_text().split() == list(nodes):
        return nodefile
    fd, path = tempfile.mkstemp(prefix="parsl-torch-hosts-", suffix=".txt")
    if not _HOST_FILES:
        atexit.register(_remove_host_files)
    _HOST_FILES.append(path)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(nodes) + "\n")
    return path
