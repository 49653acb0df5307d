"""What the benchmarks share: a clean environment and a wall-clock timer for commands."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def bench_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, the venv's bin first, one thread per rank."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PALS_", "OMPI_", "SLURM_", "PBS_"))
           and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PATH=f"{BIN}:{env.get('PATH', '')}", OMP_NUM_THREADS="1", **extra)
    return env


def timed(argv: list[str], env: dict[str, str], timeout: float = 1800) -> float:
    """Seconds ``argv`` took; exits with its stderr if it failed."""
    t0 = time.perf_counter()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise SystemExit(f"{' '.join(argv[:3])} failed:\n{out.stderr[-3000:]}")
    return time.perf_counter() - t0
