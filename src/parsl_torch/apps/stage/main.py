"""``python -m parsl_torch.apps.stage.main PAYLOAD RESULT``: one rank of a distributed app.

Sets up torch (device, process group), loads the call the app shipped
(``dill``: a function from the workflow script travels by value), runs it
(with the script's definitions it brought as ``__main__``'s: ``apps.stage.rankmain``),
and rank 0 writes the return value to RESULT (atomically). An exception
prints its traceback and exits 1, without collectives that could hang on
ranks that are already gone.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from ...common import settings
from ...common.diskspace import no_space
from ...common.entrypoints import STAGE_MAIN, internal_arguments
from ...common.files import open_private
from ...common.gcpause import paused_gc, rank_gc
from ...common.metadata import argument_secrets
from ...observe.recorder import unobserved
from ...common.raised import write_raised
from ...core.dist import cleanup, exit_process, setup_torch
from .options import load_call
from .kept import keep
from .rankmain import as_main


def main(argv: list[str] | None = None) -> int:
    if (argv := internal_arguments(STAGE_MAIN, argv, "PAYLOAD RESULT", "written by a distributed_app")) is None:
        return 2
    payload, result = argv
    if settings.KEEP_RANKS.get():  # kept up through a lost node: the run in a fork of a prepared rank
        return keep(lambda: run(payload, result))
    return run(payload, result)


def run(payload: str, result: str) -> int:
    """The rank's run of the call in PAYLOAD; rank 0 writes its value to RESULT."""
    rank_gc()
    with paused_gc(freeze=True):  # torch's, the payload's and its modules' imports (common.gcpause)
        rank = setup_torch()
        try:
            fn, args, kwargs = load_call(payload)
        except BaseException as exc:  # noqa: BLE001 - as the function's own failures, below
            _fail(exc)
    secrets = argument_secrets(fn, args, kwargs)  # (kept out of the exception text its shim reports)
    try:
        with as_main(payload, fn, args, kwargs):  # (its definitions from the workflow script found by name: apps.stage.rankmain)
            value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - report any failure of the user's code, then exit non-zero
        _fail(exc, secrets)
    if rank == 0:
        write_result(value, result)
    cleanup()
    return 0


def _fail(exc: BaseException, secrets: Sequence[str] = ()) -> NoReturn:
    """The exception for the shim's report (the stage's error names it; node-local), the traceback, exit 1:
    no collective that could hang on ranks already gone. A full disk under stderr.txt loses the traceback."""
    write_raised(exc, settings.RAISED.get(), secrets)
    with contextlib.suppress(OSError), unobserved():  # (the sources it quotes are not the stage's reads)
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(1)


def write_result(value: object, result: str) -> None:
    """Rank 0's return value, whole or not at all; one it cannot pickle ends the rank with the traceback
    and what to return instead (no ``.tmp`` is left behind)."""
    import dill

    tmp = f"{result}.tmp"
    try:
        with open_private(tmp) as f:  # (0600: a returned value may hold a secret)
            dill.dump(value, f)
        os.replace(tmp, result)
    except BaseException as exc:  # noqa: BLE001 - as the function's own failures: reported, then the rank ends
        full = no_space(result, exc)  # (before the partial file is removed)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if full is not None:
            write_raised(full, settings.RAISED.get())  # (node-local: stderr.txt may be on the full disk)
        why = f"rank 0's return value: {full}" if full else (
            f"rank 0's return value ({type(value).__module__}.{type(value).__qualname__}) cannot be pickled: return "
            f"plain data (numbers, strings, lists, dicts, arrays), or write it to a file in outputs= and return its "
            f"path")
        with contextlib.suppress(OSError), unobserved():
            traceback.print_exc()
            print(f"parsl-torch: {why}", file=sys.stderr, flush=True)
        os._exit(1)


if __name__ == "__main__":
    exit_process(main())  # a finished rank must not die in torch's exit-time destructors
