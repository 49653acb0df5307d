"""Batch blocks end: the words every layer uses to checkpoint before a block's end and
continue the stage in the next block.

The worker start-up lines of a block export when it ends (``BLOCK_END_VAR``) and the
site's grace period (``GRACE_VAR``); the supervisor turns them into the ranks'
``DEADLINE_VAR``; ranks that stop there exit with ``CONTINUE_EXIT`` and the workflow
submits the stage again.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from ..errors import ConfigError

#: epoch seconds when this block ends (the scheduler's end time, or start + walltime)
BLOCK_END_VAR = "PARSL_TORCH_BLOCK_END"
#: seconds before the block's end at which stages checkpoint and stop
GRACE_VAR = "PARSL_TORCH_GRACE"
#: epoch seconds from which ranks checkpoint and stop (block end - grace, or launch --deadline)
DEADLINE_VAR = "PARSL_TORCH_DEADLINE"
#: the stage's directory, where its ranks leave the continuation record
STAGE_DIR_VAR = "PARSL_TORCH_STAGE_DIR"
#: the stage call's identity, exported to its ranks (a checkpoint or record resumes only under the same one)
CALL_ID_VAR = "PARSL_TORCH_CALL_ID"
#: "to be continued": the stage stopped for its block's end and resumes in the next one
CONTINUE_EXIT = 99
#: rank 0's record of where the stage stands (step, checkpoint time), in the stage's directory
CONTINUATION_FILE = ".continuation.json"
#: the supervisor's record of the block an attempt runs in, in the stage's directory
BLOCK_FILE = ".block.json"

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
    if not 0 < value < math.inf:
        raise ConfigError(f"{what}: {text!r} is not a duration: give HH:MM:SS or seconds, > 0")
    return float(value)


def default_grace(walltime_s: float) -> float:
    """The larger of 2 minutes and 5% of the walltime, but at most a third of it (a short block
    still trains for two thirds of its time)."""
    return min(max(MIN_GRACE_S, GRACE_FRACTION * walltime_s), walltime_s / 3)


def deadline_from_env(env: Mapping[str, str]) -> float | None:
    """Epoch seconds from which ranks should checkpoint and stop; None when no block end is known."""
    for var in (DEADLINE_VAR, BLOCK_END_VAR):
        raw = env.get(var, "")
        if not raw:
            continue
        try:
            value = float(raw) - (float(env.get(GRACE_VAR) or 0) if var == BLOCK_END_VAR else 0)
        except ValueError:
            raise ConfigError(f"{var}={raw!r} (or {GRACE_VAR}) is not a number of seconds: parsl-torch sets "
                              f"it in a block's start-up lines; unset it") from None
        return value
    return None
