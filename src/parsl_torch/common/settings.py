"""Every environment variable parsl-torch reads or sets, in one registry.

A ``Setting`` is a variable's name, its default, how its text is parsed, what it
does, and who sets it: the user (``user=True``: listed in the README's settings
table, which ``python -m parsl_torch.common.settings`` prints and a test keeps
equal), parsl-torch itself for a process it starts (a block's end for the
supervisor, a stage's directory for its ranks), or the tests. Modules read a
variable through its ``Setting`` only (a layout test holds it), so a name is
spelled once and a bad value is refused with the variable's name and what to give.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

#: who sets a variable
USER, INTERNAL, TESTS = "user", "parsl-torch, for the processes it starts", "the tests"


def _number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return math.nan


def seconds(value: str) -> float:
    number = _number(value)
    if not 0 < number < math.inf:
        raise ValueError("give a number of seconds > 0")
    return number


#: the longest wait a timeout may ask for (torch's timedelta overflows far above it; a week is no wait)
MAX_WAIT_S = 7 * 24 * 3600.0
#: a launch's ranks report every 2 s (``launch.shim``): a node timeout under 3 periods calls healthy nodes lost
MIN_NODE_TIMEOUT_S = 6.0


def bounded_seconds(low: float, why: str) -> Callable[[str], float]:
    """Seconds from ``low`` to MAX_WAIT_S (``why``: what a value below ``low`` would do)."""
    def parse(value: str) -> float:
        number = _number(value)
        if not low <= number <= MAX_WAIT_S:
            said = why if number < low else " (a longer wait is no wait: it would never end a hung job)" \
                if number > MAX_WAIT_S else ""
            raise ValueError(f"give a number of seconds from {low:g} to {MAX_WAIT_S:g} (7 days){said}")
        return number

    return parse


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def level(value: str) -> str:
    name = value.strip().upper()
    if name not in LEVELS:
        raise ValueError(f"use one of {', '.join(LEVELS)}")
    return name


def tflops(value: str) -> float:
    number = _number(value)
    if not 0 < number < math.inf:
        raise ValueError("give the accelerator's dense bf16 peak in TFLOP/s, a number > 0 (H100 SXM: 989)")
    return number


def epoch(value: str) -> float:
    """Epoch seconds (or, for a grace period, seconds >= 0)."""
    number = _number(value)
    if not 0 <= number < math.inf:
        raise ValueError("not a number of seconds")
    return number


def text(value: str) -> str:
    return value.strip()


def flag(value: str) -> bool:
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def gpu_order(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(g) for g in value.split(","))
    except ValueError:
        raise ValueError("give device indices, e.g. 3,2,1,0") from None


def one_of(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        value = value.strip().lower()
        if value not in choices:
            raise ValueError(f"use one of {', '.join(choices)}")
        return value

    return parse


@dataclass(frozen=True)
class Setting:
    """One environment variable: ``get`` gives its parsed value (the default when unset or empty)."""

    name: str
    doc: str
    default: Any = None
    parse: Callable[[str], Any] = text
    who: str = USER

    def raw(self, env: Mapping[str, str] | None = None) -> str | None:
        value = (os.environ if env is None else env).get(self.name)
        return value if value and value.strip() else None

    def get(self, env: Mapping[str, str] | None = None) -> Any:
        raw = self.raw(env)
        if raw is None:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:  # the parsers' messages say what to give
            raise ConfigError(f"{self.name}={raw!r}: {exc}") from None


REGISTRY: dict[str, Setting] = {}


def check_user_settings(env: Mapping[str, str] | None = None) -> None:
    """Every variable a user sets, parsed now: a bad one is refused where the workflow or the launch
    starts, before anything is submitted, not on the ranks minutes later."""
    for setting in REGISTRY.values():
        if setting.who == USER:
            setting.get(env)


def _add(setting: Setting) -> Setting:
    assert setting.name not in REGISTRY, setting.name
    REGISTRY[setting.name] = setting
    return setting


# -- set by users ------------------------------------------------------------------------------
DEVICE = _add(Setting("TORCH_DEVICE", "force `cuda`, `xpu`, `mps` or `cpu`"))
BACKEND = _add(Setting("TORCH_BACKEND", "force `nccl`, `xccl`, `gloo`, `mpi` or `ccl` (checked against the device)"))
TIMEOUT = _add(Setting("PARSL_TORCH_TIMEOUT", "seconds a collective may wait (default 300: a hung rank fails the "
                       "job in minutes, not torch's default 10-30 min)", 300.0,
                       bounded_seconds(1.0, ": below 1 s every collective of a real job times out")))
NODE_TIMEOUT = _add(Setting("PARSL_TORCH_NODE_TIMEOUT", "seconds of silence after which a node of a launch counts "
                            "as lost (default 10: no healthy node of 2,048 simulated ones was called lost at 6 under "
                            "full load, `bench_node_timeout.py`; at least 6: 3 of the ranks' 2 s heartbeats; see "
                            "\"When a node is lost\")", 10.0,
                            bounded_seconds(MIN_NODE_TIMEOUT_S, ": below 3 heartbeat periods (2 s each) healthy "
                                                                "nodes are called lost")))
WAITING_SPARES = _add(Setting("PARSL_TORCH_WAITING_SPARES", "`0`: no ranks wait on a block's spares "
                              "(`mpi.spare_nodes`), and a lost node restarts every rank of a stage in place, instead "
                              "of the spare's waiting ranks joining the others, kept up (default: they wait; see "
                              "\"Recovery in place\")", True, flag))
GPU_ORDER = _add(Setting("PARSL_TORCH_GPU_ORDER", "accelerator per local rank, e.g. `3,2,1,0` (set by launches on "
                         "Polaris: its NUMA layout); rank r uses the r-th entry", None, gpu_order))
INPUT_HASH = _add(Setting("PARSL_TORCH_INPUT_HASH", "`content` (default: SHA-256 of each input File when its "
                          "size/mtime change) or `stat` (size, mtime, inode only: for huge inputs)", "content",
                          one_of("content", "stat")))
PEAK_TFLOPS = _add(Setting("PARSL_TORCH_PEAK_TFLOPS", "an accelerator's dense bf16 peak in TFLOP/s, for the MFU "
                           "a train stage records (default: from a table of the facilities' GPUs, see GPUs)", None,
                           tflops))
LOG_LEVEL = _add(Setting("PARSL_TORCH_LOG_LEVEL", "level of `get_logger` loggers: DEBUG, INFO (default), WARNING, "
                         "ERROR or CRITICAL", "INFO", level))
SCHEDULER = _add(Setting("PARSL_TORCH_SCHEDULER", "the scheduler `launch` uses: `pbs`, `slurm` or `local` "
                         "(default: detected from the job's variables)", None, lambda v: v.strip().lower()))
MACHINE = _add(Setting("PARSL_TORCH_MACHINE", "the machine (aurora, sunspot, polaris, frontier, ...; default: from "
                       "the site files' host names)"))
MPIEXEC = _add(Setting("PARSL_TORCH_MPIEXEC", "the mpiexec to launch with (default: the one beside this Python, "
                       "then PATH)"))
SITE = _add(Setting("PARSL_TORCH_SITE", "the site a workflow with `site=\"auto\"` uses (default: by host name)"))
SITE_PATH = _add(Setting("PARSL_TORCH_SITE_PATH", "`:`-separated directories of your own site files, searched "
                         "before the packaged ones"))
ACCOUNT = _add(Setting("PARSL_TORCH_ACCOUNT", "the site's account (project), over the site file"))
QUEUE = _add(Setting("PARSL_TORCH_QUEUE", "the site's queue (partition), over the site file"))
WALLTIME = _add(Setting("PARSL_TORCH_WALLTIME", "the walltime of the site's blocks (`HH:MM:SS`), over the site file"))
NODES = _add(Setting("PARSL_TORCH_NODES", "nodes per block, over the site file"))
PROGRESS = _add(Setting("PARSL_TORCH_PROGRESS", "`1`: a workflow shows its stages as they go (`parsl-torch run` "
                        "does this always)", False, flag))
PROGRESS_EVERY = _add(Setting("PARSL_TORCH_PROGRESS_EVERY", "seconds between progress blocks off a terminal "
                              "(default 30)", 30.0, seconds))
CACHE_DIR = _add(Setting("PARSL_TORCH_CACHE_DIR", "where packed Python environments are kept for "
                        "`node_local_python` and the built observer of compiled code (on a shared file system; "
                        "default `~/.cache/parsl-torch`)",
                        "~/.cache/parsl-torch"))
PLOTS = _add(Setting("PARSL_TORCH_PLOTS", "`0`: `History.finalize` (the stages' too) draws no PNG plots: a sweep "
                     "of short trials saves rank 0 about 1 s per stage; `parsl-torch history plot FILE` draws them "
                     "later (default 1)", True, flag))
RUN_DIR = _add(Setting("PARSL_TORCH_RUN_DIR", "where `History` puts `outputs/<name>/history.h5` without a path "
                       "(set for a workflow's ranks; default: the current directory)", "."))

# -- set by parsl-torch for the processes it starts ------------------------------------------
BLOCK_END = _add(Setting("PARSL_TORCH_BLOCK_END", "epoch seconds when this block ends (the scheduler's end time, "
                         "or start + walltime)", None, epoch, INTERNAL))
NODE_PYTHON = _add(Setting("PARSL_TORCH_NODE_PYTHON", "the node-local Python the ranks start (set in a block's "
                           "environment when the site has `node_local_python`)", None, text, INTERNAL))
NODE_PYTHON_UNSTAGED = _add(Setting("PARSL_TORCH_NODE_PYTHON_UNSTAGED", "why a block of a site with "
                                    "`node_local_python` could not put the Python environment on its nodes (each "
                                    "stage's supervisor says it in the stage's stderr.txt)", None, text, INTERNAL))
QUARANTINE = _add(Setting("PARSL_TORCH_QUARANTINE", "the file where a block's lost nodes are recorded (set by "
                          "parsl-torch's worker pool: the supervisor adds a node it names lost, the pool never "
                          "hands it out again)", None, text, INTERNAL))
NODES_SHORT = _add(Setting("PARSL_TORCH_NODES_SHORT", "why a stage's block cannot give it the nodes it asks for "
                           "(its lost nodes quarantined): set by parsl-torch's worker pool, reported by the "
                           "supervisor as the stage's error", None, text, INTERNAL))
SPARES = _add(Setting("PARSL_TORCH_SPARES", "the spare nodes a stage's block holds back as it starts (set by "
                     "parsl-torch's worker pool): after a lost node the supervisor claims one and goes on in place",
                     None, text, INTERNAL))
KEEP_RANKS = _add(Setting("PARSL_TORCH_KEEP_RANKS", "set by the supervisor in a function stage's ranks when a spare's ranks "
                          "wait beside them: each rank is a prepared parent that forks its training, so a lost node "
                          "costs a fresh rendezvous, not a restart (`apps.stage.kept`)", False, flag, INTERNAL))
STANDBY = _add(Setting("PARSL_TORCH_STANDBY", "set in a spare's waiting ranks: they take a lost node's ranks when the "
                       "supervisor says so (`launch.rejoin`)", False, flag, INTERNAL))
ACCELERATORS = _add(Setting("PARSL_TORCH_ACCELERATORS", "the accelerators of its node that a stage sharing the "
                            "node holds, as VARIABLE=ids (CUDA_VISIBLE_DEVICES=2,3): set by parsl-torch's worker "
                            "pool, put in the ranks' environment by the supervisor", None, text, INTERNAL))
CPU_SHARE = _add(Setting("PARSL_TORCH_CPU_SHARE", "which of its node's accelerators a stage sharing the node "
                         "holds, by position (`2,3/4`): set by parsl-torch's worker pool; the ranks' shims pin "
                         "each rank to the cores that go with its accelerator where the launcher does not bind",
                         None, text, INTERNAL))
GRACE = _add(Setting("PARSL_TORCH_GRACE", "seconds before the block's end at which stages checkpoint and stop",
                     0.0, epoch, INTERNAL))
DEADLINE = _add(Setting("PARSL_TORCH_DEADLINE", "epoch seconds from which ranks checkpoint and stop (block end - "
                        "grace, or launch --deadline)", None, epoch, INTERNAL))
STAGE_DIR = _add(Setting("PARSL_TORCH_STAGE_DIR", "the stage's directory, where its ranks leave their records",
                         None, text, INTERNAL))
CALL_ID = _add(Setting("PARSL_TORCH_CALL_ID", "the stage call's identity (a checkpoint resumes only under the "
                       "same one)", None, text, INTERNAL))
WORKFLOW = _add(Setting("PARSL_TORCH_WORKFLOW", "the token of the workflow that started a process (its watchdog "
                        "ends them with it)", None, text, INTERNAL))
LAUNCH_NOTIFY = _add(Setting("PARSL_TORCH_LAUNCH_NOTIFY", "where a rank's shim reports to `parsl-torch launch` "
                             "(host:port)", None, text, INTERNAL))
OBSERVE = _add(Setting("PARSL_TORCH_OBSERVE", "set in a stage's environment: the ranks' shims observe what their "
                       "Python processes read (`observe.recorder`), and tell the supervisor", False, flag, INTERNAL))
READS_DIR = _add(Setting("PARSL_TORCH_READS_DIR", "the node-local folder where a rank's Python processes write "
                         "what they read (set by the shim)", None, text, INTERNAL))
OBSERVE_SKIP = _add(Setting("PARSL_TORCH_OBSERVE_SKIP", "the places whose reads are no input (installed packages, "
                            "the standard library, ...), one per line, for the preloaded observer (set by the shim)",
                            None, text, INTERNAL))
OBSERVE_TEMP = _add(Setting("PARSL_TORCH_OBSERVE_TEMP", "the temporary folders, one per line: what a call made there "
                            "is its scratch (set by the shim)", None, text, INTERNAL))
OBSERVE_SINCE = _add(Setting("PARSL_TORCH_OBSERVE_SINCE", "when the call began, seconds since the epoch (set by the "
                             "shim)", None, text, INTERNAL))
RAISED = _add(Setting("PARSL_TORCH_RAISED", "the node-local file where a rank writes the exception that ended it, "
                      "for its shim's report (set by the shim)", None, text, INTERNAL))
FIRST_FAILURE = _add(Setting("PARSL_TORCH_FIRST_FAILURE", "RANK:FILE, set in a warm call's forks: the first rank "
                            "whose code raises makes FILE (once) before its process ends and its peers' "
                            "collectives break, so that rank is the call's cause", None, text, INTERNAL))
RANK_PAYLOAD = _add(Setting("PARSL_TORCH_RANK_PAYLOAD", "the call's payload, set while a rank runs a function that "
                           "brought definitions from the workflow script: a spawned child of the rank loads them from "
                           "it as its `__main__` (`apps.stage.rankmain`)", None, text, INTERNAL))
KEEP_ENVIRON = _add(Setting("SPT_NOENV", "setproctitle leaves the environment of the processes Parsl renames "
                            "(its interchange, worker pools) readable, so the workflow's token stays in it", None,
                            text, INTERNAL))
SHIM_SOURCE = _add(Setting("PARSL_TORCH_SHIM_SOURCE", "how the shim learnt the rank's topology", None, text,
                           INTERNAL))

# -- set by the tests --------------------------------------------------------------------------
FAULT = _add(Setting("PARSL_TORCH_FAULT", "fault injection: kill|hang@RANK:STEP, killsave@RANK:STEP", None, text,
                     TESTS))
REQUIRE_SLURM = _add(Setting("PARSL_TORCH_REQUIRE_SLURM", "a missing Slurm fails the tests instead of skipping",
                             False, flag, TESTS))
REQUIRE_CLUSTER = _add(Setting("PARSL_TORCH_REQUIRE_CLUSTER", "a multi-node test cluster that cannot start fails "
                               "the tests", False, flag, TESTS))
TEST_DEADLINE = _add(Setting("PARSL_TORCH_TEST_DEADLINE", "epoch seconds past which pytest starts no more tests "
                             "and reports what failed so far (.ci/run sets it inside CI's own limit)", None, epoch,
                             TESTS))
UPDATE_GOLDEN = _add(Setting("PARSL_TORCH_UPDATE_GOLDEN", "rewrite tests/golden/ from this run", False, flag, TESTS))


def markdown_table() -> str:
    """The README's settings table: the variables users set."""
    rows = ["| environment variable | effect |", "|---|---|"]
    rows += [f"| `{s.name}` | {s.doc} |" for s in REGISTRY.values() if s.who == USER]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
