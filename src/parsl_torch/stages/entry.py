"""The command-line form of a built-in stage: ``python -m parsl_torch.stages.X``
on every rank, under mpiexec, srun, torchrun or a Globus Compute MPIFunction."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from .config import load_config


def run_stage(argv: Sequence[str] | None, *, prog: str, description: str, kind: type, stage: str,
              files: dict[str, dict[str, Any]], run: Callable[[Any, argparse.Namespace], dict]) -> int:
    """Parse ``--config`` and the stage's file options, check the config, set
    up torch, run; rank 0 prints the summary as one JSON line."""
    import parsl_torch as pt

    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--config", required=True, help="the stage's YAML file (see configs/)")
    for flag, options in files.items():
        p.add_argument(flag, **options)
    args = p.parse_args(argv)
    cfg = load_config(args.config, kind, stage)  # before any rank starts talking to the others
    pt.setup_torch()
    summary = run(cfg, args)
    if pt.get_rank() == 0:
        print(json.dumps(summary), flush=True)
    pt.cleanup()
    return 0
