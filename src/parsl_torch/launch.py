"""The launch command for each scheduler: pure functions from a request to argv.

* PBS (Aurora, Sunspot, Polaris): ``mpiexec --envall --np N --ppn P
  --hostfile H --line-buffer`` plus the machine's CPU binding (Aurora: ALCF's
  12-tile list; Polaris: ``--depth 32/P --cpu-bind depth``).
* Slurm (Frontier, Perlmutter, any): ``srun --nodes K --ntasks N
  --ntasks-per-node P --kill-on-bad-exit=1`` plus Frontier's ``-c 7
  --gpus-per-task 1 --gpu-bind closest`` (8 GCDs, 56 usable cores).
* No scheduler: the venv's ``mpiexec`` (beside the Python executable), else
  one on PATH, else ``torchrun --standalone --no-python``.

Every rank goes through ``python -m parsl_torch.shim``, which exports the
torchrun variables, so unmodified ``init_process_group("env://")`` scripts
run under any of them. Defaults: ranks per node = the machine's accelerators
per node (else 1: pass -n on a workstation), all nodes of the job; every
value can be overridden.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError
from .scheduler import MACHINES, Detection
from .topology import expand_hostlist, free_port

AURORA_CPU_BIND = "list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100"
SHIM = ("-m", "parsl_torch.shim", "--")


@dataclass(frozen=True)
class LaunchRequest:
    command: tuple[str, ...]
    num_ranks: int | None = None
    ranks_per_node: int | None = None
    num_nodes: int | None = None
    launcher: str | None = None  # local only: mpiexec | torchrun (default: mpiexec if found)


@dataclass(frozen=True)
class LaunchPlan:
    argv: tuple[str, ...]
    launcher: str  # mpiexec | srun | torchrun
    scheduler: str
    machine: str | None
    num_nodes: int
    ranks_per_node: int
    num_ranks: int
    nodes: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)  # added to the launcher's environment


def job_nodes(detection: Detection, env: Mapping[str, str]) -> tuple[str, ...]:
    """The job's nodes in order, deduplicated; a clear error if the job has none."""
    if detection.scheduler == "pbs":
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
    if detection.scheduler == "slurm":
        hostlist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not hostlist:
            raise ConfigError("SLURM_JOB_NODELIST is not set: launch inside a Slurm job (salloc or sbatch)")
        return tuple(expand_hostlist(hostlist))
    return ("localhost",)


def resolve_shape(request: LaunchRequest, available_nodes: int, default_ppn: int) -> tuple[int, int, int]:
    """(num_nodes, ranks_per_node, num_ranks) from what was asked and what the job has."""
    for flag, value in (("-n", request.num_ranks), ("--ppn", request.ranks_per_node),
                        ("--nodes", request.num_nodes)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value}: must be at least 1")
    n, ppn, nodes = request.num_ranks, request.ranks_per_node, request.num_nodes
    if nodes is not None and nodes > available_nodes:
        raise ConfigError(f"--nodes {nodes}: the job has only {available_nodes} node(s)")
    if n is None:
        nodes = nodes or available_nodes
        ppn = ppn or default_ppn
        n = nodes * ppn
    elif ppn is None:
        nodes = nodes or min(available_nodes, math.ceil(n / default_ppn))
        ppn = math.ceil(n / nodes)
    else:
        nodes = nodes or math.ceil(n / ppn)
    if nodes > available_nodes or n > nodes * ppn:
        raise ConfigError(f"-n {n} does not fit {nodes} node(s) x {ppn} ranks per node "
                          f"(the job has {available_nodes} node(s)): lower -n or raise --ppn/--nodes")
    if n <= (nodes - 1) * ppn:
        raise ConfigError(f"-n {n} with --ppn {ppn} leaves nodes of the {nodes} empty: use --nodes "
                          f"{math.ceil(n / ppn)}")
    return nodes, ppn, n


def binding_args(machine: str | None, ppn: int) -> list[str]:
    """The machine's CPU/GPU binding flags for ``ppn`` ranks per node (its launcher's syntax)."""
    if machine in ("aurora", "sunspot"):
        # ALCF's binding for one rank per GPU tile; else spread 104 cores evenly
        return ["--cpu-bind", AURORA_CPU_BIND] if ppn == 12 else ["--depth", str(104 // ppn), "--cpu-bind", "depth"]
    if machine == "polaris":
        return ["--depth", str(max(1, 32 // ppn)), "--cpu-bind", "depth"]
    if machine == "frontier":
        return ["--cpus-per-task", "7", "--gpus-per-task", "1", "--gpu-bind", "closest"]
    return []


def pbs_argv(machine: str | None, num_ranks: int, ppn: int, hostfile: str, mpiexec: str) -> list[str]:
    return [mpiexec, "--envall", "--np", str(num_ranks), "--ppn", str(ppn), "--hostfile", hostfile,
            "--line-buffer", *binding_args(machine, ppn)]


def slurm_argv(machine: str | None, num_nodes: int, num_ranks: int, ppn: int) -> list[str]:
    return ["srun", "--nodes", str(num_nodes), "--ntasks", str(num_ranks), "--ntasks-per-node", str(ppn),
            "--kill-on-bad-exit=1", *binding_args(machine, ppn)]


def local_argv(num_ranks: int, mpiexec: str | None, torchrun: str | None) -> list[str]:
    if mpiexec:
        return [mpiexec, "-n", str(num_ranks)]
    if torchrun:
        return [torchrun, "--standalone", f"--nproc-per-node={num_ranks}", "--no-python"]
    raise ConfigError("no launcher found: pip install 'parsl-torch[mpi]' for mpiexec, "
                      "or put torchrun on PATH")


def find_local_tool(name: str) -> str | None:
    """``name`` beside this Python (the venv's bin) first, then on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which(name)


def plan_launch(request: LaunchRequest, detection: Detection, env: Mapping[str, str] | None = None,
                python: str | None = None) -> LaunchPlan:
    """Everything to start the ranks, checked before anything runs."""
    env = os.environ if env is None else env
    python = python or sys.executable
    if not request.command:
        raise ConfigError("no command to launch: parsl-torch launch [options] -- python train.py ...")
    if not detection.in_job:
        raise ConfigError(f"{detection.reason}: no {detection.scheduler.upper()} job to launch in; start one "
                          f"(qsub -I / salloc) or set PARSL_TORCH_SCHEDULER=local")
    native = {"pbs": "mpiexec", "slurm": "srun"}.get(detection.scheduler)
    if request.launcher not in (None, native) and (native or request.launcher not in ("mpiexec", "torchrun")):
        raise ConfigError(f"--launcher {request.launcher}: under {detection.scheduler} use "
                          f"{native or 'mpiexec or torchrun'}")
    machine = MACHINES.get(detection.machine or "")
    nodes = job_nodes(detection, env)
    default_ppn = machine.accelerators_per_node if machine else 1
    num_nodes, ppn, n = resolve_shape(request, len(nodes), default_ppn)
    command = [python, *SHIM, *request.command]
    extra: dict[str, str] = {}
    if "MASTER_PORT" not in env:
        extra["MASTER_PORT"] = str(free_port())

    if detection.scheduler == "pbs":
        mpiexec = env.get("PARSL_TORCH_MPIEXEC") or shutil.which("mpiexec")
        if not mpiexec:
            raise ConfigError("mpiexec is not on PATH: load the MPI module (module load ...) "
                              "or set PARSL_TORCH_MPIEXEC")
        hostfile = _hostfile(nodes[:num_nodes], env["PBS_NODEFILE"])
        argv, launcher = pbs_argv(detection.machine, n, ppn, hostfile, mpiexec), "mpiexec"
        if "MASTER_ADDR" not in env:  # mpiexec places rank 0 on the hostfile's first node
            extra["MASTER_ADDR"] = nodes[0]
    elif detection.scheduler == "slurm":
        if not shutil.which("srun"):
            raise ConfigError("srun is not on PATH inside a Slurm job: check the Slurm installation")
        argv, launcher = slurm_argv(detection.machine, num_nodes, n, ppn), "srun"
        # rank 0 runs on the step's first node: the shim reads it from SLURM_STEP_NODELIST
    else:
        mpiexec = None if request.launcher == "torchrun" else (
            env.get("PARSL_TORCH_MPIEXEC") or find_local_tool("mpiexec"))
        if request.launcher == "mpiexec" and not mpiexec:
            raise ConfigError("--launcher mpiexec: no mpiexec beside this Python or on PATH: "
                              "pip install 'parsl-torch[mpi]'")
        argv = local_argv(n, mpiexec, None if mpiexec else find_local_tool("torchrun"))
        launcher = "mpiexec" if mpiexec else "torchrun"
        if "MASTER_ADDR" not in env:
            extra["MASTER_ADDR"] = "127.0.0.1"
    _check_executable(argv[0])
    return LaunchPlan(tuple(argv + command), launcher, detection.scheduler, detection.machine,
                      num_nodes, ppn, n, nodes[:num_nodes], extra)


def _hostfile(nodes: Sequence[str], nodefile: str) -> str:
    """PBS_NODEFILE itself when it already lists exactly these nodes once each."""
    if Path(nodefile).read_text().split() == list(nodes):
        return nodefile
    fd, path = tempfile.mkstemp(prefix="parsl-torch-hosts-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(nodes) + "\n")
    return path


def _check_executable(program: str) -> None:
    if not (os.path.isfile(program) and os.access(program, os.X_OK)) and not shutil.which(program):
        raise ConfigError(f"launcher {program!r} does not exist or is not executable")
