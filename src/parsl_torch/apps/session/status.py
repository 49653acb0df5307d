"""A run's stages and their progress, from files only: ``<run_dir>/status.json``
(the workflow writes it as stages change state), ``<stage>/.started`` (written
when a stage's command starts) and ``*.progress.json`` beside each history file
(rank 0, at its syncs). ``parsl-torch run`` shows it live, ``parsl-torch status
RUN_DIR`` from another shell."""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ...common import stagedir
from ...common.files import write_atomic
from ...common.procs import proc_stat
from ...core import log
from ...errors import ConfigError
from ...launch import quarantine

STATUS = "status.json"
_lock = threading.Lock()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class StatusFile:
    """The workflow's side: one record per stage, rewritten atomically on each change."""

    def __init__(self, run_dir: Path, site: str) -> None:
        self.path = run_dir / STATUS
        self._earlier = _earlier_results(self.path)
        self.data: dict[str, Any] = {"site": site, "host": os.uname().nodename, "pid": os.getpid(),
                                     "started": _now(), "finished": None, "stages": {}}
        self._unwritten = False
        self._write()

    def stage(self, name: str, **fields: Any) -> None:
        with _lock:
            self.data["stages"].setdefault(name, {}).update(fields, updated=_now())
            self._write()

    def skipped(self, name: str, **fields: Any) -> None:
        """A stage whose files are an earlier run's: it keeps that run's result (when and how long)."""
        self.stage(name, state="skipped", earlier=self._earlier.get(name), **fields)

    def finish(self, ended: str | None = None) -> None:
        """The workflow's end; ``ended``: how it stopped early ("interrupted (SIGINT)"), its stages that
        had not finished then are "stopped"."""
        with _lock:
            self.data["finished"] = _now()
            if ended:
                self.data["ended"] = ended
                for stage in self.data["stages"].values():
                    if stage.get("state") in ("waiting", "running"):
                        stage.update(state="stopped", error=f"the workflow was {ended}")
            self._write()

    def _write(self) -> None:
        """The record, rewritten; where it cannot be (a full file system), the run goes on without it
        (what each stage writes fails and says why itself), said once, and written again when it can be."""
        try:
            write_atomic(self.path, json.dumps(self.data, indent=1))
        except OSError as exc:
            if not self._unwritten:
                log.get_logger("parsl_torch.workflow").warning(
                    "cannot write %s (%s): `parsl-torch status` shows the run as it was before", self.path,
                    exc.strerror or exc)
            self._unwritten = True
        else:
            self._unwritten = False


def _earlier_results(path: Path) -> dict[str, dict[str, Any]]:
    """Stage -> {finished, seconds} of its last run that did it, from the status file a run leaves."""
    try:
        stages = json.loads(path.read_text()).get("stages", {})
    except (OSError, ValueError, AttributeError):
        return {}
    found = {}
    for name, s in stages.items() if isinstance(stages, dict) else ():
        if isinstance(s, dict) and s.get("state") == "done":
            found[name] = {"finished": s.get("updated"), "seconds": s.get("seconds")}
        elif isinstance(s, dict) and s.get("state") == "skipped" and isinstance(s.get("earlier"), dict):
            found[name] = s["earlier"]  # (skipped again: still that run's)
    return found


#: how many of a result's values status keeps (a result is meant to be a few metrics)
RESULT_VALUES = 20


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _metric(value: Any) -> int | float | None:
    """A number as status keeps it (None: not a number): NumPy's and other real types as Python's, an
    integer past 64 bits as a float (``10**400``: inf; one of 5,000 digits JSON cannot write at all)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # (NumPy's bool_ is not a Real)
        return None
    if isinstance(value, numbers.Integral):
        whole = int(value)
        if abs(whole) < 2 ** 63:
            return whole
        value = whole
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def result_metrics(value: Any) -> dict[str, Any]:
    """What ``status`` keeps of a stage's result: a dict's numbers (the first RESULT_VALUES), or a lone
    number as ``result``. Never its text: status.json is readable by others, and a result's strings
    may be anything (a path with a user name, a token)."""
    if isinstance(value, dict):
        kept = {str(k): _metric(v) for k, v in value.items()}
        return dict(list({k: v for k, v in kept.items() if v is not None}.items())[:RESULT_VALUES])
    return {"result": number} if (number := _metric(value)) is not None else {}


def _result_text(result: dict[str, Any] | None) -> str:
    """"result eval_loss=0.06532 eval_acc=0.9772": a finished stage's own result, not its last batch's."""
    numbers = {k: v for k, v in (result or {}).items() if _number(v)}
    if not numbers:
        return ""
    return "result " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in numbers.items())


def _waiting(s: dict[str, Any], stages: dict[str, Any]) -> str:
    """"for train" (a stage whose results it takes that has not finished), else "for a free slot": the
    line reads ``[evaluate] waiting for train``."""
    pending = [w for w in s.get("waits_for", []) if stages.get(w, {}).get("state") not in ("done", "skipped")]
    return f"for {', '.join(pending)}" if pending else "for a free slot"


@dataclass
class StageRow:
    name: str
    state: str  # waiting | running | done | skipped | failed
    progress: str  # "step 120/200 loss=0.41 ETA 0:01:05", or ""
    error: str
    directory: str
    result: dict[str, Any] | None = None  # a finished stage's (``result_metrics``)


def _progress(stage_dir: Path, started: float | None, first_step: int = 0) -> str:
    """``first_step``: where this attempt started (a continuation resumes there): the ETA's rate
    counts this attempt's steps only."""
    files = sorted(stage_dir.glob("*" + stagedir.PROGRESS_SUFFIX), key=lambda p: p.stat().st_mtime)
    p = stagedir.read_or_none(files[-1], stagedir.ProgressRecord) if files else None
    if p is None:
        return ""
    step, total = p.step, p.total
    text = f"step {step + 1}/{total}" if total else f"step {step + 1}"
    if p.metric is not None and p.value is not None:
        text += f" {p.metric}={p.value:.4g}"
    if p.mfu is not None:
        text += f" MFU {p.mfu:.1%}"
    if total and started and first_step <= step and step + 1 < total:
        rate = (p.time - started) / (step + 1 - first_step)
        text += f" ETA {int(rate * (total - step - 1)) // 60}:{int(rate * (total - step - 1)) % 60:02d}"
    return text


def _earlier(earlier: dict[str, Any] | None) -> str:
    if not earlier:
        return "done by an earlier run"
    took = f" in {earlier['seconds']} s" if earlier.get("seconds") is not None else ""
    return f"done by an earlier run ({earlier.get('finished')}{took})"


def _continued(stage_dir: Path, s: dict[str, Any], state: str) -> str:
    """"continued in block 2 (2 block ends)", or, between blocks, where it will resume."""
    ends = f"{s['continuations']} block end{'s' if s['continuations'] > 1 else ''}"
    block = stagedir.read_or_none(stage_dir / stagedir.BLOCK, stagedir.BlockRecord)
    if state != "waiting" and block is not None and block.started >= s.get("submitted_at", 0):
        return f"continued in block {block.block} ({ends})"
    return f"to continue in the next block from step {s.get('continued_at_step')} ({ends})"


def _held(stage_dir: Path, s: dict[str, Any]) -> str:
    """"on accelerators 2,3": what a running stage that shares its node holds there."""
    block = stagedir.read_or_none(stage_dir / stagedir.BLOCK, stagedir.BlockRecord)
    if block is None or not block.accelerators or block.started < s.get("submitted_at", 0):
        return ""
    variable, _, ids = block.accelerators.partition("=")
    return f"on accelerator(s) {ids} ({variable})"


def read(run_dir: str | os.PathLike) -> tuple[dict[str, Any], list[StageRow]]:
    """The run's header (site, host, pid, started, finished) and a row per stage."""
    run_dir = Path(run_dir)
    try:
        data = json.loads((run_dir / STATUS).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{run_dir} has no {STATUS}: not a parsl-torch run directory, or no workflow "
                                f"has started there") from None
    except (OSError, ValueError) as exc:  # cut short (a full disk, a kill mid-write by an older version), garbage
        raise ConfigError(f"{run_dir / STATUS} is damaged ({type(exc).__name__}: {exc}): the next workflow on "
                          f"this run directory writes it anew; the stages' own files are in their folders") from None
    if not isinstance(data, dict) or not isinstance(data.get("stages", {}), dict):
        raise ConfigError(f"{run_dir / STATUS} is damaged (not a run's status record): the next workflow on this "
                          f"run directory writes it anew")
    if not data.get("finished") and _gone(data):  # killed (SIGKILL, a lost login node): it could not say so
        data["ended"] = f"gone: its process (host {data.get('host')}, PID {data.get('pid')}) no longer runs"
        for stage in data.get("stages", {}).values():
            if isinstance(stage, dict) and stage.get("state") in ("waiting", "running"):
                stage.update(state="stopped", error="the workflow's process is gone")
    rows = [_row(run_dir, name, s, data.get("stages", {})) for name, s in data.get("stages", {}).items()]
    data["quarantined"] = quarantine.read(run_dir / "parsl" / quarantine.FILE)
    data["spares"] = quarantine.read(run_dir / "parsl" / quarantine.SPARES_FILE)
    return data, rows


def _row(run_dir: Path, name: str, s: dict[str, Any], stages: dict[str, Any]) -> StageRow:
    """One stage's row: its state (waiting, running, done...) and what it has done so far."""
    stage_dir = run_dir / name
    started_file = stage_dir / stagedir.STARTED
    started = started_file.stat().st_mtime if started_file.exists() else None
    state = s.get("state", "waiting")
    if state == "waiting" and started and started >= s.get("submitted_at", 0):
        state = "running"
    first_step = s.get("continued_at_step") or 0  # where a continuation resumed
    progress = _progress(stage_dir, started, first_step) if state in ("running", "failed", "done", "stopped") \
        else ""
    if state == "skipped":  # its files, and its result, are those of the run that did it
        progress = "; ".join(filter(None, (_progress(stage_dir, None), _earlier(s.get("earlier")))))
    if s.get("continuations"):
        progress = "; ".join(filter(None, (_continued(stage_dir, s, state), progress)))
    if state == "running":
        progress = "; ".join(filter(None, (_held(stage_dir, s), progress)))
    if state in ("done", "skipped"):  # its own result, after where it got to
        progress = "; ".join(filter(None, (progress, _result_text(s.get("result")))))
    if state == "waiting" and not s.get("continuations"):  # (a continuation says where it resumes)
        progress = "; ".join(filter(None, (_waiting(s, stages), progress)))
    return StageRow(name, state, progress, s.get("error", ""), str(stage_dir), s.get("result"))


def lowest_is_best(metric: str) -> bool:
    """Losses, errors, perplexities and times are best low; anything else (accuracy, MFU) high."""
    return any(word in metric.lower() for word in ("loss", "err", "perplexity", "ppl", "time", "seconds"))


def ranked(rows: list[StageRow], metric: str, lowest_first: bool | None = None) -> list[StageRow]:
    """The finished stages whose result has ``metric``, best first (``lowest_first``: else by its name)."""
    have = [r for r in rows if _number((r.result or {}).get(metric))]
    if not have:
        known = sorted({k for r in rows for k in (r.result or {})})
        raise ConfigError(f"--sort {metric}: no finished stage's result has it; the results have: "
                          f"{', '.join(known) or 'nothing yet (no stage has finished with a dict of numbers)'}")
    low = lowest_is_best(metric) if lowest_first is None else lowest_first
    # a trial whose metric is nan (it diverged) is never the best: last, whatever the order
    return sorted(have, key=lambda r: (math.isnan(r.result[metric]), r.result[metric] * (1 if low else -1)))


def _gone(data: dict[str, Any]) -> bool:
    """The workflow that wrote ``data`` ran on this host and its process has ended (or its PID is
    another process's now: it started after the run did)."""
    pid = data.get("pid")
    if data.get("host") != os.uname().nodename or not isinstance(pid, int):
        return False  # (another host's process cannot be looked at from here)
    stat = proc_stat(pid)
    if stat is None or stat.state == "Z":
        return True
    try:
        started = datetime.fromisoformat(data.get("started", ""))
        boot = time.time() - float(Path("/proc/uptime").read_text().split()[0])
        begun = boot + int(stat.start) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, TypeError):
        return False
    return begun > started.timestamp() + 2  # a process that began after the run: the PID was reused


def ending(data: dict[str, Any]) -> str:
    """How the run stands: "running (host h, PID p)", "finished T", "interrupted (SIGINT) at T", "gone: ..."."""
    if data.get("ended"):
        return f"{data['ended']}" + (f" at {data['finished']}" if data.get("finished") else "")
    if data.get("finished"):
        return f"finished {data['finished']}"
    return f"running (host {data.get('host')}, PID {data.get('pid')})"


def quarantined_lines(data: dict[str, Any]) -> list[str]:
    """A line per node a block lost (no stage is placed on it again in that job) and per spare taken."""
    return [*(f"quarantined: node {node} of job {job}: {why}" for job, nodes in data.get("quarantined", {}).items()
              for node, why in sorted(nodes.items())),
            *(f"spare: node {node} of job {job}: " + (why if why.startswith(quarantine.THE_BLOCK) else
                                                       f"in a lost node's place for the stage on {why}")
              for job, nodes in data.get("spares", {}).items() for node, why in sorted(nodes.items()))]


def plain(data: dict[str, Any], rows: list[StageRow]) -> str:
    """One line per stage (logs, CI, batch jobs)."""
    lines = [f"[{r.name}] {r.state}" + (f" {r.progress}" if r.progress else "") + (f" - {r.error}" if r.error else "")
             for r in rows]
    return "\n".join([*lines, *quarantined_lines(data)])


class _Above:
    """A stream whose lines a rich console prints above its live display."""

    def __init__(self, console: Any) -> None:
        self.console = console

    def write(self, text: str) -> None:
        self.console.print(text, end="", markup=False, highlight=False, emoji=False, soft_wrap=True)

    def flush(self) -> None:
        self.console.file.flush()


def table(data: dict[str, Any], rows: list[StageRow]) -> Any:
    """A rich Table (terminals)."""
    from rich.table import Table
    from rich.text import Text

    t = Table(title=f"site {data.get('site')}, {ending(data)}")
    for column in ("stage", "state", "progress", "error / directory"):
        t.add_column(column)
    colours = {"done": "green", "skipped": "cyan", "failed": "red", "running": "yellow", "waiting": "white",
               "stopped": "magenta"}
    for r in rows:
        # Text, not markup: the table is also drawn under a log line that the console prints without markup
        t.add_row(Text(r.name), Text(r.state, style=colours.get(r.state, "white")), Text(r.progress),
                  Text(r.error or r.directory))
    if lines := quarantined_lines(data):
        t.caption = "\n".join(lines)
    return t


def watch(run_dir: Path, stop: threading.Event, every: float, tty: bool) -> None:
    """Show the run until ``stop``: a live table on a terminal, else a plain block every ``every`` s.

    The live table never replaces ``sys.stdout``/``sys.stderr`` (rich's redirection): this runs on a
    thread beside the user's script, which prints, and pickles functions whose globals may reach
    those streams; a proxy left there by a display that ends on another thread crashed the script's
    next ``print``. The package's log lines go above the table through its console instead."""
    if tty:
        from rich.console import Console
        from rich.live import Live

        console = Console(stderr=True)
        with Live(console=console, refresh_per_second=2, transient=False, redirect_stdout=False,
                  redirect_stderr=False) as live, log.lines_to(_Above(console)):
            while not stop.wait(1.0):
                with contextlib.suppress(OSError, ValueError):
                    live.update(table(*read(run_dir)))
            with contextlib.suppress(OSError, ValueError):
                live.update(table(*read(run_dir)))
        return
    last = 0.0
    while not stop.wait(1.0):
        if time.monotonic() - last >= every:
            last = time.monotonic()
            try:
                text = plain(*read(run_dir))
            except (OSError, ValueError):
                continue
            if text:
                print(f"parsl-torch: progress\n{text}", file=sys.stderr, flush=True)


class Progress:
    """The thread that shows the stages as they go (``watch``)."""

    #: seconds the last refresh may take when the workflow ends
    FINAL_S = 10.0

    def __init__(self, run_dir: Path, show: bool, every: float) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=watch, daemon=True, args=(
            run_dir, self._stop, every, sys.stderr.isatty())) if show else None
        if self._thread is not None:
            self._thread.start()

    def stop(self) -> None:
        """End the display before the workflow's block returns: what the script prints next comes after it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.FINAL_S)
