"""A sweep's trials' files as its watcher sees them: on this machine (read and written here), or on a
Globus Compute endpoint whose files this machine cannot read (read and written by one small task per look,
on the site's I/O endpoint: ``globus.io_endpoint_id``, a thread-pool endpoint beside the site's, on its file
system). What the watcher needs of a trial is small: whose attempt its directory holds, and its history's
metric at the steps it is judged on; what it leaves there is smaller: the rungs, then each ruling (and for a
promoted trial, its finished call's record removed)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...common import stagedir
from ...errors import ConfigError
from ..identity.freshdir import owner

#: seconds a task on the I/O endpoint may take (a trial waits at most ``core.deadline.RULING_WAIT_S`` at a rung)
IO_TIMEOUT_S = 30.0
#: seconds between two looks through the I/O endpoint: the SDK's Executor sends at most 4 requests in 16 s
REMOTE_POLL_S = 4.0


@dataclass(frozen=True)
class Peek:
    """One look at a trial's directory: its newest history's mtime (None: no history yet), and unless the
    history was unchanged since the last look, the call of its identity record, the call that owns the
    directory, the steps the history holds and the metric at the steps asked for."""

    mtime: float | None
    read: bool = False  # False: unchanged since the last look (or no history): nothing else was read
    call: str | None = None
    owner: str | None = None
    steps: int | None = None
    values: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Ask:
    """What to look at in one trial's directory: ``read_at`` the mtime it was read at last; ``final``: the
    trial ended (its whole history, read even if unchanged); the metric at the ``window`` steps before each
    of ``rungs`` (and, final, before its last step). Without ``history``: only whose call it holds."""

    stage_dir: str
    read_at: float | None
    final: bool
    rungs: tuple[int, ...]
    history: bool = True


def peek(ask: Ask, metric: str, window: int) -> Peek:
    """Runs where the trial's files are."""
    stage_dir = Path(ask.stage_dir)
    files = histories(stage_dir, ask.final) if ask.history else []
    mtime = files[0][0] if files else None
    if ask.history and not ask.final and (mtime is None or mtime == ask.read_at):
        return Peek(mtime)
    record = stagedir.read_or_none(stage_dir / stagedir.IDENTITY, stagedir.IdentityRecord)
    steps, values = _history(files, metric)
    wanted = {s for at in (*ask.rungs, *([steps] if ask.final and steps else [])) for s in range(at - window, at)}
    return Peek(mtime, True, record.call_id if record else None, owner(stage_dir), steps,
                {s: v for s, v in values.items() if s in wanted})


def peek_many(asks: Sequence[Ask], metric: str, window: int) -> list[Peek]:
    """``peek`` of each: the task that a look sends to an I/O endpoint."""
    return [peek(ask, metric, window) for ask in asks]


def put_many(records: Sequence[tuple[str, Any]]) -> None:
    """Each record written whole at its path (its folder made), in their order; None: the file removed (a
    promoted trial's record of its finished call, so that its call runs again): the task that leaves rungs
    and rulings."""
    for path, record in records:
        if record is None:
            stagedir.forget(path)
            continue
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        stagedir.write(path, record)


def histories(stage_dir: Path, final: bool) -> list[tuple[float, Path]]:
    """The trial's history files, newest first (the partial one while it runs), with their mtimes."""
    found = []
    for path in stage_dir.glob("*.h5" if final else "*.h5*"):
        if path.suffix in (".h5", ".partial"):
            with contextlib.suppress(FileNotFoundError):  # (the partial file moved into place as it was listed)
                found.append((path.stat().st_mtime, path))
    return sorted(found, reverse=True)


def _history(files: list[tuple[float, Path]], metric: str) -> tuple[int | None, dict[int, float]]:
    """(steps the newest history holds, step -> metric: the mean over ranks where recorded)."""
    import h5py

    from ...history.h5file import dataset_name

    for _, path in files:
        try:
            with h5py.File(path, "r", locking=False) as f:
                name = dataset_name(metric)
                name = f"{name}_mean" if f"{name}_mean" in f else name
                if name not in f:
                    continue
                steps, values = f["step"][:], f[name][:]
        except (OSError, KeyError):
            continue  # (replaced as it was opened: read at the next look)
        return (int(steps.max()) + 1 if len(steps) else 0), dict(zip(steps.tolist(), values.tolist()))
    return None, {}


def rung_value(values: dict[int, float], at: int, window: int) -> float:
    """The metric over the ``window`` steps before step ``at`` (NaN unless every one of them is there)."""
    got = [values[s] for s in range(at - window, at) if s in values and math.isfinite(values[s])]
    return sum(got) / len(got) if len(got) == window else math.nan


class LocalFiles:
    """Trials whose directories this process reads and writes itself."""

    poll_s = 0.2  # (five looks a second: a look at an unchanged history is one stat per file)

    def peek(self, asks: Sequence[Ask], metric: str, window: int, timeout: float | None = None) -> list[Peek]:
        return peek_many(asks, metric, window)

    def put(self, records: Iterable[tuple[Path, Any]], timeout: float | None = None) -> None:
        put_many([(str(path), record) for path, record in records])

    def close(self) -> None:
        pass


class EndpointFiles:
    """Trials on an endpoint whose files this machine cannot read: each look is one task on the site's
    I/O endpoint (``executor``: a Globus Compute Executor for it), and so is each batch of records left."""

    poll_s = REMOTE_POLL_S

    def __init__(self, executor: Any, endpoint_id: str) -> None:
        self.executor, self.endpoint_id = executor, endpoint_id

    def peek(self, asks: Sequence[Ask], metric: str, window: int, timeout: float | None = None) -> list[Peek]:
        peeks = self._run(peek_many, list(asks), metric, window, timeout=timeout) if asks else []
        for ask, seen in zip(asks, peeks):
            if ask.final and ask.history and seen.call is None:  # (a trial that ran has its identity there)
                raise ConfigError(f"pt.sweep: the I/O endpoint {self.endpoint_id} (globus.io_endpoint_id) does not "
                                  f"see {ask.stage_dir}, where the site's endpoint ran the trial: give the id of an "
                                  f"endpoint on the same file system (a sweep it cannot read would judge nothing)")
        return peeks

    def put(self, records: Iterable[tuple[Path, Any]], timeout: float | None = None) -> None:
        if records := [(str(path), record) for path, record in records]:
            self._run(put_many, records, timeout=timeout)

    def _run(self, fn: Any, *args: Any, timeout: float | None = None) -> Any:
        timeout = IO_TIMEOUT_S if timeout is None else timeout
        try:
            return self.executor.submit(fn, *args).result(timeout=timeout)
        except TimeoutError:
            raise ConfigError(f"pt.sweep: the I/O endpoint {self.endpoint_id} (globus.io_endpoint_id) did not run "
                              f"a look at the trials' files within {timeout:g} s: is it started "
                              f"(globus-compute-endpoint start), and does it see the site's files?") from None

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
