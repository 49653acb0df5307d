"""Which scheduler and machine this process runs under: one implementation
for launch, doctor, sites and apps.

Order: ``PARSL_TORCH_SCHEDULER`` (pbs | slurm | local), then a PBS job
(``PBS_JOBID``), then a Slurm job (``SLURM_JOB_ID``), then the hostname
(table below) for the machine's scheduler outside a job, then none (local).
Installed binaries are never evidence: a laptop with ``sbatch`` on PATH is
still local. The machine comes from ``PARSL_TORCH_MACHINE`` or the table.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ConfigError

SCHEDULERS = ("pbs", "slurm", "local")


@dataclass(frozen=True)
class Machine:
    name: str
    scheduler: str
    hostnames: tuple[str, ...]  # regular expressions, matched against the full hostname
    accelerators_per_node: int
    device: str
    env_hint: tuple[str, str] | None = None  # (variable, value) that also identifies it


MACHINES: dict[str, Machine] = {m.name: m for m in (
    Machine("aurora", "pbs", (r"^aurora-uan-\d+", r"^x4\d{3}c\d+s\d+b\d+n\d+", r"\.aurora\.alcf\.anl\.gov$"),
            12, "xpu"),
    Machine("sunspot", "pbs", (r"^x1\d{3}c\d+s\d+b\d+n\d+", r"\.sunspot\.alcf\.anl\.gov$"), 12, "xpu"),
    Machine("polaris", "pbs", (r"^polaris-login-\d+", r"^x3\d{3}c\d+s\d+b\d+n\d+", r"\.polaris\.alcf\.anl\.gov$"),
            4, "cuda"),
    Machine("frontier", "slurm", (r"^frontier\d{5}", r"\.frontier\.olcf\.ornl\.gov$"), 8, "cuda",
            ("LMOD_SYSTEM_NAME", "frontier")),
    Machine("perlmutter", "slurm", (r"perlmutter", r"\.nersc\.gov$"), 4, "cuda", ("NERSC_HOST", "perlmutter")),
)}


@dataclass(frozen=True)
class Detection:
    scheduler: str  # pbs | slurm | local
    machine: str | None
    in_job: bool
    reason: str


def machine_for(env: Mapping[str, str], hostname: str) -> tuple[Machine | None, str]:
    forced = env.get("PARSL_TORCH_MACHINE")
    if forced:
        if forced not in MACHINES:
            raise ConfigError(f"PARSL_TORCH_MACHINE={forced!r} is unknown: use one of {', '.join(MACHINES)}")
        return MACHINES[forced], f"PARSL_TORCH_MACHINE={forced}"
    for m in MACHINES.values():
        if m.env_hint and env.get(m.env_hint[0]) == m.env_hint[1]:
            return m, f"{m.env_hint[0]}={m.env_hint[1]}"
        for pattern in m.hostnames:
            if re.search(pattern, hostname):
                return m, f"hostname {hostname} matches {pattern}"
    return None, f"hostname {hostname} matches no known machine"


def detect_scheduler(env: Mapping[str, str] | None = None, hostname: str | None = None) -> Detection:
    env = os.environ if env is None else env
    hostname = hostname or socket.gethostname()  # getfqdn can block on DNS
    machine, why = machine_for(env, hostname)
    name = machine.name if machine else None
    forced = env.get("PARSL_TORCH_SCHEDULER", "").strip().lower()
    if forced:
        if forced not in SCHEDULERS:
            raise ConfigError(f"PARSL_TORCH_SCHEDULER={forced!r} is unknown: use one of {', '.join(SCHEDULERS)}")
        in_job = {"pbs": "PBS_JOBID", "slurm": "SLURM_JOB_ID"}.get(forced, "") in env
        return Detection(forced, name, in_job or forced == "local", f"PARSL_TORCH_SCHEDULER={forced}")
    if env.get("PBS_JOBID"):
        return Detection("pbs", name, True, f"PBS job {env['PBS_JOBID']}")
    if env.get("SLURM_JOB_ID"):
        return Detection("slurm", name, True, f"Slurm job {env['SLURM_JOB_ID']}")
    if machine is not None:
        return Detection(machine.scheduler, name, False, f"{why}, outside a job")
    return Detection("local", None, True, f"no PBS_JOBID or SLURM_JOB_ID; {why}")
