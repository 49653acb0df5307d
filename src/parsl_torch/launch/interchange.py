"""``python -m parsl_torch.launch.interchange``: Parsl's interchange (its ``interchange.py``, which
reads its configuration from standard input), with Parsl imported lean (``launch.leanparsl``): the
interchange starts in every workflow, a rerun that skips every stage included."""

from __future__ import annotations

import logging
import runpy
import sys

from ..common.entrypoints import INTERCHANGE
from .leanparsl import lean_imports

#: Parsl's interchange, run as this process's main module
INTERCHANGE_MODULE = "parsl.executors.high_throughput.interchange"


def main() -> None:
    if sys.argv[1:]:
        sys.exit(f"usage: python -m {INTERCHANGE} < CONFIG  (Parsl's executor starts it, its configuration pickled "
                 f"on standard input; not for use by hand)")
    # its log is in the run directory: where that disk is full, Python would print a traceback for every
    # record on the workflow's terminal (the workflow says once that Parsl's log cannot be written)
    logging.raiseExceptions = False
    with lean_imports():
        runpy.run_module(INTERCHANGE_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
