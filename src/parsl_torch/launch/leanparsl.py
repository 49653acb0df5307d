"""Parsl imported without the packages its interchange and worker pool never use.

``import parsl`` imports its Globus Compute executor and its monitoring database whenever
globus-compute-sdk and SQLAlchemy are installed (the ``endpoint`` extra installs both): about
0.5 s of CPU of the 1 s that Parsl's import costs, in each of the three processes a workflow
starts before its first stage runs (the interchange, the worker pool, the pool's forkserver),
none of which uses either.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

#: what Parsl imports if it can (``try: import ... except ImportError``), for executors and a
#: monitoring database that run in the workflow's process, never in these
UNUSED = ("globus_compute_sdk", "sqlalchemy")


def import_lean(name: str) -> ModuleType:
    """Module ``name`` imported while UNUSED are blocked (Parsl takes them as absent), then unblocked:
    a task this process runs later may still import them."""
    blocked = [m for m in UNUSED if m not in sys.modules]
    sys.modules.update(dict.fromkeys(blocked))
    try:
        return importlib.import_module(name)
    finally:
        for m in blocked:
            if m in sys.modules and sys.modules[m] is None:
                del sys.modules[m]
