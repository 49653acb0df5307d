"""``parsl-torch doctor``: is this environment ready, and if not, what to do.

Each check returns a status (ok, warn, error, skip), what it found and, when
not ok, the remedy. The last check launches 2 ranks locally and runs one
all_reduce with a short timeout: the whole stack, for real. Inside a job of
several nodes it launches one rank on every node instead, through the job's
launcher, and names the nodes that did not answer.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import sites
from ..parslext import PATCHES
from ..parslext import check as check_parsl_patches
from ..observe import native as preload
from ..common import settings
from ..common.entrypoints import CLI
from ..common.environ import find_local_tool, path_with_python_bin
from ..common.metadata import installed_version
from ..core.device import get_backend, get_torch_device_type
from ..core.dist import collective_timeout
from ..errors import ConfigError, ParslTorchError
from ..launch.accelerators import visible_accelerators
from ..launch.events import short
from ..launch.leanparsl import parsl_for_a_workflow
from ..launch.schedulers import get_scheduler

SMOKE_TIMEOUT_S = 90
_SMOKE = ("import parsl_torch as pt, torch, torch.distributed as dist; pt.setup_torch(timeout=30); "
          "t = torch.ones(1, device=pt.get_torch_device()); dist.all_reduce(t); "
          "import sys; sys.stdout.write(f'smoke rank {pt.get_rank()} sum {t.item():g}\\n'); sys.stdout.flush(); "
          "pt.cleanup()")
# Ranks share mpiexec's stdout; with PYTHONUNBUFFERED=1 print() writes the text and
# the newline separately, so lines of two ranks can merge. Match, don't split.
_SMOKE_LINE = re.compile(r"smoke rank (\d+) sum (\d+)")
_NODE_SMOKE = ("import parsl_torch as pt, torch, torch.distributed as dist, socket, sys; pt.setup_torch(timeout=30); "
               "t = torch.ones(1, device=pt.get_torch_device()); dist.all_reduce(t); "
               "sys.stdout.write(f'node smoke {socket.gethostname()} sum {t.item():g}\\n'); sys.stdout.flush(); "
               "pt.cleanup()")
_NODE_SMOKE_LINE = re.compile(r"node smoke (\S+) sum (\d+)")


@dataclass
class Check:
    name: str
    status: str  # ok | warn | error | skip
    detail: str
    remedy: str = ""


def check_python() -> Check:
    ok = sys.version_info >= (3, 10)
    return Check("python", "ok" if ok else "error", f"{sys.version.split()[0]} at {sys.executable}",
                 "" if ok else "use Python 3.10 or newer")


def check_torch() -> Check:
    try:
        import torch
    except ImportError as exc:
        return Check("torch", "error", f"cannot import torch: {exc}",
                     "pip install torch (your site's build, or torch==2.13.0 for CPU)")
    return Check("torch", "ok", f"torch {torch.__version__}")


def check_device() -> Check:
    try:
        device = get_torch_device_type()
        backend = get_backend(device)
    except ParslTorchError as exc:
        return Check("device/backend", "error", str(exc), "fix or unset TORCH_DEVICE / TORCH_BACKEND")
    import torch

    count = getattr(torch, device).device_count() if device in ("cuda", "xpu") else 0
    where = f"{count} {device} device(s)" if count else device
    return Check("device/backend", "ok", f"{where}, backend {backend}")


def check_timeout() -> Check:
    try:
        return Check("collective timeout", "ok", f"{collective_timeout():g} s")
    except ParslTorchError as exc:
        return Check("collective timeout", "error", str(exc), "set PARSL_TORCH_TIMEOUT to seconds, e.g. 300")


def check_mpi() -> Check:
    mpiexec = settings.MPIEXEC.get() or find_local_tool("mpiexec")
    try:
        from mpi4py import MPI

        lib = " ".join(MPI.Get_library_version().split()[:3])
    except ImportError:
        return Check("mpi", "warn", f"no mpi4py; mpiexec: {mpiexec or 'none'}",
                     "pip install 'parsl-torch[mpi]' (or your site's mpi4py) for MPI launches and fast statistics")
    if not mpiexec:
        return Check("mpi", "warn", f"mpi4py with {lib}, but no mpiexec", "load your MPI module or pip install mpich")
    return Check("mpi", "ok", f"mpi4py {installed_version('mpi4py')} with {lib}; mpiexec {mpiexec}")


def check_scheduler() -> Check:
    try:
        d = sites.detect_job()
        if not d.in_job:
            return Check("scheduler", "warn", f"{d.scheduler} ({d.reason})",
                         "launch inside a job (qsub -I / salloc), or set PARSL_TORCH_SCHEDULER=local")
        nodes = get_scheduler(d.scheduler).job_nodes(os.environ)
    except ParslTorchError as exc:
        return Check("scheduler", "error", str(exc), "run inside a complete job allocation")
    machine = f", machine {d.machine}" if d.machine else ""
    return Check("scheduler", "ok", f"{d.scheduler}{machine}: {len(nodes)} node(s) ({d.reason})")


def check_wandb() -> Check:
    version = installed_version("wandb")
    mode = os.environ.get("WANDB_MODE", "online")
    if version is None:
        return Check("wandb", "skip", "not installed (optional)", "pip install 'parsl-torch[wandb]' to track runs")
    has_key = bool(os.environ.get("WANDB_API_KEY")) or "api.wandb.ai" in _read(Path.home() / ".netrc")
    if mode in ("offline", "disabled", "dryrun") or has_key:
        return Check("wandb", "ok", f"wandb {version}, WANDB_MODE={mode}")
    return Check("wandb", "warn", f"wandb {version}, WANDB_MODE={mode}, no API key",
                 "wandb login, or WANDB_MODE=offline on nodes without network (wandb sync later)")


def check_observer() -> Check:
    """Reruns see what compiled code reads only through the preloaded observer, which needs a C compiler."""
    library = preload.library()
    if library is None:
        return Check("reads below Python", "warn", f"{preload.why_not()}: what compiled loaders (safetensors, "
                     f"pyarrow, ...), tools and shell stages read is not observed, so a stage that reads through "
                     f"them reruns every time", "install a C compiler (gcc), or set CC")
    return Check("reads below Python", "ok", f"observed (the preloaded observer: {library})")


_REINSTALL = "pip install -e . in parsl-torch's folder (the Parsl version pyproject.toml names)"


def check_parsl() -> Check:
    """What parsl-torch reaches into in Parsl's private parts is where it expects it (``parslext``)."""
    try:
        parsl_for_a_workflow()
        check_parsl_patches()
    except ConfigError as exc:
        return Check("parsl internals", "error", str(exc).split(". Install")[0], _REINSTALL)
    except ImportError as exc:
        return Check("parsl internals", "error", f"cannot import Parsl: {exc}", _REINSTALL)
    return Check("parsl internals", "ok", f"parsl {installed_version('parsl')}: the {len(PATCHES)} places parsl-torch "
                 f"reaches into hold")


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text()
    return ""


def _optional(name: str, dist: str, purpose: str, extra: str) -> Callable[[], Check]:
    def check() -> Check:
        version = installed_version(dist)
        if version is None:
            return Check(name, "skip", f"not installed ({purpose})", f"pip install {extra}")
        return Check(name, "ok", f"{dist} {version}")

    return check


def _job_nodes() -> tuple[str, ...]:
    """The nodes of the job this runs in (empty outside a job or when it cannot be read)."""
    with contextlib.suppress(ParslTorchError):
        d = sites.detect_job()
        return get_scheduler(d.scheduler).job_nodes(os.environ) if d.in_job and d.scheduler != "local" else ()
    return ()


def check_nodes(nodes: tuple[str, ...]) -> Check:
    """One rank on every node of the job, one all_reduce, through the job's launcher."""
    env = {**os.environ, settings.TIMEOUT.name: "30"}
    env["PATH"] = path_with_python_bin(env)
    name = f"all_reduce on {len(nodes)} nodes"
    cmd = [sys.executable, "-m", CLI, "launch", "--nodes", str(len(nodes)), "--ppn", "1",
           "--timeout", str(SMOKE_TIMEOUT_S), "--", sys.executable, "-c", _NODE_SMOKE]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        return Check(name, "error", "hung past its timeout", "parsl-torch launch --ppn 1 by hand")
    answered = {host: int(total) for host, total in _NODE_SMOKE_LINE.findall(out.stdout)}
    missing = [n for n in nodes if n not in answered and short(n) not in answered]
    if out.returncode == 0 and not missing and set(answered.values()) == {len(nodes)}:
        return Check(name, "ok", f"{len(nodes)} ranks agreed (sum {len(nodes)}) on {', '.join(nodes)}")
    tail = " | ".join(out.stderr.strip().splitlines()[-3:])
    silent = f"no answer from {', '.join(missing)}; " if missing else ""
    return Check(name, "error", f"{silent}exit {out.returncode}: {tail}",
                 "check those nodes (module loads, the venv on a shared file system, the network), "
                 "then parsl-torch launch --ppn 1 -- hostname")


def check_smoke() -> Check:
    """The ranks a local stage runs (one per accelerator this host sees, else 2), one all_reduce,
    through parsl-torch launch."""
    env = {**os.environ, settings.SCHEDULER.name: "local", settings.TIMEOUT.name: "30"}
    env["PATH"] = path_with_python_bin(env)
    n = visible_accelerators(env) or 2
    name = f"{n}-rank all_reduce"
    cmd = [sys.executable, "-m", CLI, "launch", "-n", str(n), "--timeout", str(SMOKE_TIMEOUT_S),
           "--", sys.executable, "-c", _SMOKE]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        return Check(name, "error", "hung past its timeout", f"run parsl-torch launch -n {n} by hand")
    sums = sorted(_SMOKE_LINE.findall(out.stdout))
    if out.returncode == 0 and sums == [(str(r), str(n)) for r in range(n)]:
        return Check(name, "ok", f"{n} ranks agreed (sum {n})")
    return Check(name, "error", f"exit {out.returncode}: {_cause(out.stdout + out.stderr)}",
                 f"fix the cause above, then parsl-torch launch -n {n} -- python -c 'import parsl_torch'")


#: a line that states an error: a Python exception's last line, or the supervisor's word on a rank
_ERROR_LINE = re.compile(r"^(?:[\w.]+(?:Error|Exception): |parsl-torch: rank \d+ )")


def _cause(output: str) -> str:
    """The lines that say what failed (the first exception, the supervisor's word), else the last lines:
    shown to the person, never used to decide anything."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    stated = [line for line in lines if _ERROR_LINE.match(line)]
    return " | ".join(dict.fromkeys(stated[:1] + stated[-1:]) if stated else lines[-4:])


CHECKS: tuple[Callable[[], Check], ...] = (
    check_python, check_torch, check_device, check_timeout, check_mpi, check_scheduler, check_wandb, check_observer, check_parsl,
    _optional("parsl", "parsl", "needed for sites and workflows", "parsl"),
    _optional("globus-compute", "globus-compute-sdk", "optional: remote submission", "'parsl-torch[globus]'"),
)


def run_checks(smoke: bool = True) -> list[Check]:
    results = []
    for check in CHECKS:
        try:
            results.append(check())
        except Exception as exc:  # noqa: BLE001 - a broken check is a finding, not a crash
            results.append(Check(check.__name__.removeprefix("check_"), "error", f"{type(exc).__name__}: {exc}"))
    blocked = any(r.status == "error" for r in results if r.name in ("torch", "device/backend"))
    if smoke:
        nodes = _job_nodes()
        results.append(Check("live all_reduce", "skip", "torch or device is broken") if blocked
                       else check_nodes(nodes) if len(nodes) > 1 else check_smoke())
    return results


def as_json(results: list[Check]) -> list[dict]:
    return [asdict(r) for r in results]
