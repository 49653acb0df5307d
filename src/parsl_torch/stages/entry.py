"""The command-line form of a built-in stage: ``python -m parsl_torch.stages.X``
on every rank, under mpiexec, srun or torchrun."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from ..core.dist import cleanup, setup_torch
from ..core.ranks import get_rank
from .config import load_config


def run_stage(argv: Sequence[str] | None, *, prog: str, description: str, config_class: type, stage: str,
              files: dict[str, dict[str, Any]], run: Callable[[Any, argparse.Namespace], dict]) -> int:
    """Parse the config (a YAML file) and the stage's file options, check the config, set up torch, run; rank 0
    prints the summary, with a summary of the history, as one JSON line."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--config", required=True, help="the stage's YAML file (see configs/)")
    for flag, options in files.items():
        p.add_argument(flag, **options)
    args = p.parse_args(argv)
    cfg = load_config(args.config, config_class, stage)  # before any rank starts talking to the others
    setup_torch()
    summary = run(cfg, args)
    if get_rank() == 0:
        from ..history.h5file import read_history, summarize

        summary["history_summary"] = summarize(read_history(summary["history"]))
        print(json.dumps(summary), flush=True)
    cleanup()
    return 0
