"""A failing rank's exception as one line, for its shim's report (``launch.shim``, ``launch.events``).

The shim makes a private node-local file and names it in ``settings.RAISED`` (its open file under
/proc where there is one: ``launch.shim._raised_file``); the rank writes the
exception that ends it there (a function stage's ``stage.main`` when the function raises; a script,
through the ``sys.excepthook`` that ``setup_torch`` adds, when an exception reaches the top), and
the shim puts it in its failure report. So the stage's error names the exception, however the
tail of its stderr was cut.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Collection
from pathlib import Path
from typing import Any

from . import settings
from .metadata import redact_text, secret_values

#: the most of an exception's text a report carries (a tensor's repr in a message can be megabytes)
RAISED_CHARS = 400


def raised_line(exc: BaseException, secrets: Collection[str] = ()) -> str:
    """``RuntimeError: bad config keys`` as one line, secrets in it redacted (``secrets``: the call's arguments
    named as secrets), at most RAISED_CHARS."""
    text = " ".join(" ".join(traceback.format_exception_only(type(exc), exc)).split())
    text = redact_text(text, [*secret_values(os.environ), *secrets])  # (a stage's env= and the shell's are here)
    return text if len(text) <= RAISED_CHARS else text[:RAISED_CHARS - 1] + "…"


def claim_first(path: str | os.PathLike, rank: int | str) -> None:
    """Make ``path`` naming ``rank`` unless a rank made it first; whole when it appears (a link of a
    written file), so a reader never sees it empty. Best effort."""
    mine = f"{path}.{os.getpid()}"
    with contextlib.suppress(OSError):  # (FileExistsError: another rank failed first)
        try:
            with open(mine, "w") as f:
                f.write(str(rank))
            os.link(mine, path)
        finally:
            os.unlink(mine)


def first_claimed(path: str | os.PathLike) -> int | None:
    """The rank that ``claim_first`` named in ``path``; None if none did."""
    try:
        return int(Path(path).read_text())
    except (OSError, ValueError):
        return None


def write_raised(exc: BaseException, path: str | None, secrets: Collection[str] = ()) -> None:
    """Leave the exception that ends this rank where its shim reads it (``settings.RAISED``), ``secrets``
    redacted; best effort.
    A warm call's fork first claims the call's first failure (``settings.FIRST_FAILURE``): now, not when
    its parent sees it end, after its peers' collectives broke and they raised too."""
    if path:
        with contextlib.suppress(OSError), open(path, "w") as f:
            f.write(raised_line(exc, secrets))
    if first := settings.FIRST_FAILURE.get():
        rank, _, claim = first.partition(":")
        claim_first(claim, rank)


def read_raised(path: str) -> str:
    """What ``write_raised`` left, then gone (emptied, and removed where ``path`` is a name of its own, not a
    shim's open file under /proc), so that a warm rank's next call cannot report it; "" if nothing."""
    try:
        with open(path, "r+", errors="replace") as f:
            text = f.read(RAISED_CHARS * 4)
            f.truncate(0)
    except OSError:
        return ""
    if not path.startswith("/proc/"):
        with contextlib.suppress(OSError):
            os.unlink(path)
    return text[:RAISED_CHARS]


def report_uncaught() -> None:
    """Where the shim asks for it: an exception that reaches the top of this process is written for the
    shim (then shown as before). Added once; for a script that calls ``setup_torch``."""
    path = settings.RAISED.get()
    if not path or getattr(sys.excepthook, "parsl_torch_raised", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        write_raised(exc, path)
        previous(kind, exc, tb)

    hook.parsl_torch_raised = True  # type: ignore[attr-defined]
    sys.excepthook = hook
