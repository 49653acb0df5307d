"""What the benchmarks share: a clean environment, a wall-clock timer for commands, and the
environment and site files of a workflow on the multi-node test cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent


def bench_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, the venv's bin first, one thread per rank."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PALS_", "OMPI_", "SLURM_", "PBS_"))
           and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PATH=f"{BIN}:{env.get('PATH', '')}", OMP_NUM_THREADS="1", **extra)
    return env


def rank_json(script: Path, ranks: int, *args: str, env: dict[str, str] | None = None,
              cwd: str | None = None) -> dict:
    """Rank 0's JSON line (its last line) of ``script`` on ``ranks`` ranks through ``parsl-torch launch``;
    exits with its stderr if it failed."""
    out = subprocess.run([str(BIN / "parsl-torch"), "launch", "-n", str(ranks), "--", sys.executable, str(script),
                          *args], capture_output=True, text=True, timeout=1800, env=env or bench_env(), cwd=cwd)
    if out.returncode:
        raise SystemExit(f"{script.name} {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    import json

    return json.loads(out.stdout.strip().splitlines()[-1])


def timed(argv: list[str], env: dict[str, str], timeout: float = 1800) -> float:
    """Seconds ``argv`` took; exits with its stderr if it failed."""
    t0 = time.perf_counter()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise SystemExit(f"{' '.join(argv[:3])} failed:\n{out.stderr[-3000:]}")
    return time.perf_counter() - t0


REPO = Path(__file__).resolve().parent.parent
TEST_SITES = REPO / "tests" / "sites"


def cluster_env(cluster: Any, sites: Path, **extra: str) -> dict[str, str]:
    """bench_env for a workflow on the multi-node test cluster (``cluster``: tests/cluster/cluster.py,
    started): its nodes, its Slurm, the fake PBS, the site files in ``sites`` before the test sites."""
    env = bench_env(**cluster.env_lines(cluster.node_names(3)),
                    SLURM_CONF=str(cluster.STATE / "slurm" / "slurm.conf"),
                    PARSL_TORCH_SITE_PATH=f"{sites}:{TEST_SITES}", **extra)
    env["PATH"] = f"{REPO / 'tests' / 'fakes' / 'pbs'}:{BIN}:/usr/local/sbin:/usr/sbin:/sbin:{env['PATH']}"
    return env


def site_variant(sites: Path, base: str, name: str, **changes: Any) -> None:
    """Site file ``name`` in ``sites``: test site ``base`` with ``changes`` (a mapping updates that section)."""
    import yaml

    site = yaml.safe_load((TEST_SITES / f"{base}.yaml").read_text())
    for key, value in changes.items():
        site[key] = {**site[key], **value} if isinstance(value, dict) else value
    site["name"] = name
    sites.mkdir(exist_ok=True)
    (sites / f"{name}.yaml").write_text(yaml.safe_dump(site))
