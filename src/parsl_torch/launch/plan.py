"""A launch request becomes a launch plan: pure functions, checked before
anything runs.

The scheduler record (``schedulers``) gives the job's nodes and the launch
command (PBS: ``mpiexec --envall --np N --ppn P --hostfile H``; Slurm:
``srun --nodes K --ntasks N --ntasks-per-node P``; no scheduler: the venv's
``mpiexec -n N``, else ``torchrun --standalone``), the machine record
(``machines``) the default ranks per node and the binding flags. Every rank
goes through the shim (``python -m parsl_torch.launch.shim``), which exports
the torchrun variables, so unmodified ``init_process_group("env://")``
scripts run under any of them. Defaults: all nodes of the job, ranks per
node = the machine's accelerators per node (else 1: pass -n on a
workstation); every value can be overridden.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..common.entrypoints import SHIM
from ..core.topology import free_port
from ..errors import ConfigError
from .accelerators import visible_accelerators
from .machines import get_machine
from .schedulers import Detection, get_scheduler


@dataclass(frozen=True)
class LaunchRequest:
    command: tuple[str, ...]
    num_ranks: int | None = None
    ranks_per_node: int | None = None
    num_nodes: int | None = None
    launcher: str | None = None  # one of the scheduler's launchers (default: its first that is found)


@dataclass(frozen=True)
class LaunchPlan:
    argv: tuple[str, ...]
    launcher: str  # the program that starts the ranks: mpiexec | srun | torchrun
    scheduler: str
    machine: str | None
    num_nodes: int
    ranks_per_node: int
    num_ranks: int
    nodes: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)  # added to the launcher's environment


#: no machine runs more ranks than this on one node: a larger count is a typo
MAX_RANKS_PER_NODE = 1024


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
    if ppn > MAX_RANKS_PER_NODE:
        raise ConfigError(f"{ppn} ranks per node (from -n {n} over {nodes} node(s)): more than "
                          f"{MAX_RANKS_PER_NODE} is no machine's; check -n, --ppn and --nodes")
    if nodes > available_nodes or n > nodes * ppn:
        raise ConfigError(f"-n {n} does not fit {nodes} node(s) x {ppn} ranks per node "
                          f"(the job has {available_nodes} node(s)): lower -n or raise --ppn/--nodes")
    if n <= (nodes - 1) * ppn:
        raise ConfigError(f"-n {n} with --ppn {ppn} leaves nodes of the {nodes} empty: use --nodes "
                          f"{math.ceil(n / ppn)}")
    return nodes, ppn, n


def plan_launch(request: LaunchRequest, detection: Detection, env: Mapping[str, str] | None = None,
                python: str | None = None) -> LaunchPlan:
    """Everything to start the ranks, checked before anything runs."""
    env = os.environ if env is None else env
    if not request.command:
        raise ConfigError("no command to launch: parsl-torch launch [options] -- python train.py ...")
    if not detection.in_job:
        raise ConfigError(f"{detection.reason}: no {detection.scheduler.upper()} job to launch in; start one "
                          f"(qsub -I / salloc) or set PARSL_TORCH_SCHEDULER=local")
    scheduler = get_scheduler(detection.scheduler)
    if request.launcher is not None and request.launcher not in scheduler.launchers:
        raise ConfigError(f"--launcher {request.launcher}: under {detection.scheduler} use "
                          f"{' or '.join(scheduler.launchers) or 'nothing (it starts no ranks here)'}")
    machine = get_machine(detection.machine)
    nodes = scheduler.job_nodes(env)
    # what the job asked for (--ntasks-per-node, mpiprocs) beats the machine's accelerators per node
    asked = scheduler.job_ranks_per_node(env)
    here = visible_accelerators(env) if scheduler.one_machine else 0  # (a batch job's nodes are not this host)
    default_ppn = asked if asked and asked > 1 else (machine.accelerators_per_node if machine else here or 1)
    num_nodes, ppn, n = resolve_shape(request, len(nodes), default_ppn)
    nodes = nodes[:num_nodes]
    start = scheduler.rank_launch(request.launcher, num_nodes, ppn, n, nodes, machine, env)
    _check_executable(start.argv[0])
    extra = {k: v for k, v in {**(machine.rank_env() if machine else {}), **start.env}.items() if k not in env}
    if "MASTER_PORT" not in env:
        extra["MASTER_PORT"] = str(free_port())
    python = python or sys.executable
    command = (python, "-m", SHIM, "--", *_this_python(request.command, python))
    return LaunchPlan((*start.argv, *command), start.program, detection.scheduler, detection.machine,
                      num_nodes, ppn, n, nodes, extra)


#: a command that starts with one of these means the Python that runs parsl-torch (not PATH's)
PYTHON_NAMES = ("python", "python3")


def _this_python(command: tuple[str, ...], python: str) -> tuple[str, ...]:
    """``python train.py`` runs ``python``, the Python that runs parsl-torch (its venv, activated or
    not), as ``-m`` does: PATH's ``python`` may be another interpreter, without torch."""
    return (python, *command[1:]) if command[0] in PYTHON_NAMES else command


def _check_executable(program: str) -> None:
    if not (os.path.isfile(program) and os.access(program, os.X_OK)) and not shutil.which(program):
        raise ConfigError(f"launcher {program!r} does not exist or is not executable")
