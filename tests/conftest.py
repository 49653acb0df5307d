"""Shared fixtures: launching real ranks and keeping the test process clean."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
RANKS_DIR = Path(__file__).parent / "ranks"
# variables a launcher sets; a test's child must not inherit them from the runner
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCH_DEVICE", "TORCH_BACKEND", "PBS_NODEFILE", "PBS_JOBID")
LAUNCHER_PREFIXES = ("PMI_", "PALS_", "OMPI_", "SLURM_", "MPI_LOCAL")


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without any launcher variables, with the venv first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)}
    if "SLURM_CONF" in os.environ:
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def launch(launcher: str, n: int, args: list[str], timeout: float = 180, **kw) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` on n ranks with a real launcher; fails the test on a hang."""
    py = [sys.executable, *args]
    if launcher == "mpiexec":
        cmd = [str(BIN / "mpiexec"), "-n", str(n), *py]
    elif launcher == "torchrun":
        cmd = [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={n}", *args]
    elif launcher == "srun":
        cmd = ["srun", "--mpi=pmi2", "-n", str(n), "--time=5", *py]
    elif launcher == "srun-nompi":
        cmd = ["srun", "--mpi=none", "-n", str(n), "--time=5", *py]
    else:
        raise ValueError(launcher)
    env = kw.pop("env", None) or clean_env()
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture
def slurm() -> None:
    """A running Slurm cluster (CI starts one with ../shared/scripts/start-slurm.sh)."""
    if not os.environ.get("SLURM_CONF") or not shutil.which("srun"):
        if os.environ.get("PARSL_TORCH_REQUIRE_SLURM"):
            pytest.fail("PARSL_TORCH_REQUIRE_SLURM is set but no Slurm cluster is running")
        pytest.skip("no Slurm cluster: run ../shared/scripts/start-slurm.sh and "
                    "source /tmp/slurm-local/slurm.env (CI does)")


@pytest.fixture(autouse=True)
def _no_leaked_master_env():
    """Tests must not leave MASTER_ADDR/MASTER_PORT behind for later tests."""
    before = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    yield
    after = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    assert after == before, f"test leaked {after}"
