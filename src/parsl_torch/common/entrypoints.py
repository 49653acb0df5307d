"""The package's modules that are run as ``python -m MODULE`` inside command
strings (a Parsl bash app's command, a launch, the doctor's smoke run, a
Globus Compute ``MPIFunction``): named once here, checked by a test that
each imports and has a ``main``.

Strings, not imports: the command is built in a process (the workflow, a
login node) that must not import what runs on the ranks.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

SUPERVISE = "parsl_torch.launch.supervise"  # fail fast, time out, leave nothing behind
SHIM = "parsl_torch.launch.shim"  # torchrun variables and failure reports for each rank
PREFLIGHT = "parsl_torch.launch.preflight"  # a rank of the pre-flight check: Python starts, answers
NODE_PYTHON = "parsl_torch.launch.nodepython"  # the Python environment staged to node-local storage
STAGE_MAIN = "parsl_torch.apps.stage.main"  # one rank of a distributed_app
WARM_RANK = "parsl_torch.apps.warm.rank"  # one rank of a warm group: forks each call
CLI = "parsl_torch.cli"  # the parsl-torch command
WATCHDOG = "parsl_torch.apps.session.watchdog"  # ends what a workflow started when the workflow dies
INTERCHANGE = "parsl_torch.launch.interchange"  # Parsl's interchange, its Parsl imported lean
POOL_PRELOAD = "parsl_torch.launch.pool_preload"  # imported (not run) by the worker pool's forkserver
STAGES_PACKAGE = "parsl_torch.stages"  # built-in stage NAME runs as python -m parsl_torch.stages.NAME


def internal_arguments(module: str, argv: list[str] | None, usage: str, who: str) -> list[str] | None:
    """The arguments of a module that parsl-torch runs itself (``usage``: their names; ``who`` runs it), or
    None once its usage line is printed (a person ran it by hand)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == len(usage.split()) and not argv[0].startswith("-"):
        return argv
    print(f"usage: python -m {module} {usage}  ({who}; not for use by hand)", file=sys.stderr)
    return None


def shim_at(command: Sequence[str]) -> int:
    """The index of the ``-m`` of ``-m parsl_torch.launch.shim`` (the Python before it; binding flags before
    that); -1: none."""
    return next((i for i in range(1, len(command) - 1) if command[i] == "-m" and command[i + 1] == SHIM), -1)


def stage_module(stage: str) -> str:
    """The module a built-in stage runs as on every rank."""
    return f"{STAGES_PACKAGE}.{stage}"
