"""The environment variables a stage is given or was seen to read, as its ranks get them: its ``env=``, else the
workflow's environment, which the ranks inherit; a launch's own variables are never compared."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from ...observe.recorder import launch_variable
from .digests import sha


def env_components(names: Sequence[str], stage_env: Mapping[str, str],
                   environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env <NAME>`` for each variable named: its value as the ranks get it (the stage's
    ``env=``, else this process's environment, which the ranks inherit), as a digest; a launch's own
    variables (ranks, rendezvous, the scheduler's) are not the user's and not compared."""
    environ = os.environ if environ is None else environ
    values = {name: stage_env.get(name, environ.get(name)) for name in names if not launch_variable(name)}
    return {f"env {name}": "unset" if value is None else sha(f"{name}={value}".encode())
            for name, value in values.items()}
