"""The command-line form of a built-in stage: ``python -m parsl_torch.stages.X``
on every rank, under mpiexec, srun, torchrun or a Globus Compute MPIFunction."""

from __future__ import annotations

import argparse
import base64
import json
from collections.abc import Callable, Sequence
from typing import Any

from ..core.dist import cleanup, setup_torch
from ..core.ranks import get_rank
from .config import load_config


def run_stage(argv: Sequence[str] | None, *, prog: str, description: str, config_class: type, stage: str,
              files: dict[str, dict[str, Any]], run: Callable[[Any, argparse.Namespace], dict]) -> int:
    """Parse the config (a YAML file, or base64 JSON as Globus Compute sends it)
    and the stage's file options, check the config, set up torch, run; rank 0
    prints the summary, with a summary of the history, as one JSON line."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="the stage's YAML file (see configs/)")
    source.add_argument("--config-b64", help="the config as base64-encoded JSON")
    for flag, options in files.items():
        p.add_argument(flag, **options)
    args = p.parse_args(argv)
    config = args.config or json.loads(base64.b64decode(args.config_b64))
    cfg = load_config(config, config_class, stage)  # before any rank starts talking to the others
    setup_torch()
    summary = run(cfg, args)
    if get_rank() == 0:
        from ..history.h5file import read_history, summarize

        summary["history_summary"] = summarize(read_history(summary["history"]))
        print(json.dumps(summary), flush=True)
    cleanup()
    return 0
