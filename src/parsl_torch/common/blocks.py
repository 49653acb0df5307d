"""Batch blocks end: the words every layer uses to checkpoint before a block's end and
continue the stage in the next block.

The worker start-up lines of a block export when it ends (``settings.BLOCK_END``) and the
site's grace period (``settings.GRACE``); the supervisor turns them into the ranks'
``settings.DEADLINE``; ranks that stop there exit with ``CONTINUE_EXIT`` and the workflow
submits the stage again.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from ..errors import ConfigError
from . import settings

#: "to be continued": the stage stopped for its block's end and resumes in the next one
CONTINUE_EXIT = 99

MIN_GRACE_S = 120.0
GRACE_FRACTION = 0.05
_DURATION = re.compile(r"^(?:(\d+):)?(\d+):(\d+)$")


def duration_seconds(text: str, what: str) -> float:
    """``HH:MM:SS``, ``MM:SS`` or a number of seconds, as seconds (> 0)."""
    text = str(text).strip()
    m = _DURATION.match(text)
    try:
        value = (int(m.group(1) or 0) * 3600 + int(m.group(2)) * 60 + int(m.group(3))) if m else float(text)
    except ValueError:
        value = math.nan
    if m and (int(m.group(3)) > 59 or m.group(1) is not None and int(m.group(2)) > 59):
        raise ConfigError(f"{what}: {text!r} is not a duration: minutes and seconds go up to 59 in HH:MM:SS "
                          f"(e.g. 01:30:00), or give seconds")
    if not 0 < value < math.inf:
        raise ConfigError(f"{what}: {text!r} is not a duration: give HH:MM:SS or seconds, > 0")
    return float(value)


def default_grace(walltime_s: float) -> float:
    """The larger of 2 minutes and 5% of the walltime, but at most a third of it (a short block
    still trains for two thirds of its time)."""
    return min(max(MIN_GRACE_S, GRACE_FRACTION * walltime_s), walltime_s / 3)


def deadline_from_env(env: Mapping[str, str]) -> float | None:
    """Epoch seconds from which ranks should checkpoint and stop; None when no block end is known."""
    try:
        deadline = settings.DEADLINE.get(env)
        if deadline is not None:
            return deadline
        end = settings.BLOCK_END.get(env)
        return None if end is None else end - settings.GRACE.get(env)
    except ConfigError as exc:
        raise ConfigError(f"{exc}: parsl-torch sets it in a block's start-up lines; unset it") from None
