"""One workflow per run directory at a time, on any shared file system.

``<run_dir>/.lock`` is created with its content in one step (a hard link to a
file already written: atomic, and failing when the lock exists, on local disks,
Lustre, GPFS and NFSv3+, unlike ``flock`` across nodes; O_EXCL then a write where
a file system has no hard links) and holds the holder's host, PID, process
start time and start date. A lock that is empty or unreadable is a crash's (or
a full disk's): taken over at once. The holder touches it every
HEARTBEAT_S seconds. A lock is stale, and taken over without anyone's help,
when its holder is gone: on the same host, its process no longer exists (or
is another process with the same PID); from another host, the lock has not
been touched for STALE_S seconds. A stale lock is removed under a second
O_EXCL file (``.lock.takeover``) after being judged stale again, so of two
workflows that find the same stale lock exactly one gets the directory.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from ..errors import ConfigError
from .diskspace import NO_SPACE
from .procs import proc_stat

LOCK = ".lock"
#: held for the milliseconds of a takeover of a stale lock
TAKEOVER = ".lock.takeover"
HEARTBEAT_S = 30.0
STALE_S = 300.0
TAKEOVER_STALE_S = 30.0
#: a lock being written without hard links is empty for microseconds: an empty one older than this is a crash's
DAMAGED_STALE_S = 2.0


def _start_time(pid: int) -> str | None:
    """The process's start time (tells a reused PID apart)."""
    stat = proc_stat(pid)
    return stat.start if stat else None


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process, but it exists
    return started is None or _start_time(pid) in (None, started)


class LockWatch:
    """For a stage's supervisor: is the workflow that holds ``<run_dir>/.lock`` now (the one that
    started this stage) still there? Gone when the lock is removed or taken by another
    workflow, when its process is gone (same host), or when it stopped touching it."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / LOCK
        self.holder = self._read()

    def _read(self) -> dict | None:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else None
        return None

    def gone(self) -> str | None:
        """Why the workflow is gone, or None while it is there (None too if there never was a lock)."""
        if self.holder is None:
            return None
        now = self._read()
        if now is None or now.get("token") != self.holder.get("token"):
            return f"the workflow that started it (host {self.holder.get('host')}, PID {self.holder.get('pid')}) " \
                   f"has ended: its run directory lock is gone"
        if now.get("host") == socket.gethostname() and isinstance(now.get("pid"), int) \
                and not _alive(now["pid"], now.get("started")):
            return f"the workflow that started it (PID {now['pid']}) is gone"
        with contextlib.suppress(OSError):
            if time.time() - self.path.stat().st_mtime > STALE_S:
                return f"the workflow that started it (host {now.get('host')}) has not touched its lock for " \
                       f"{STALE_S:.0f} s"
        return None


class RunLock:
    """``with RunLock(run_dir):`` holds the run directory or fails at once naming the holder."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK
        self.token = secrets.token_hex(8)
        self._stop = threading.Event()

    def __enter__(self) -> RunLock:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "started": _start_time(os.getpid()),
              "since": datetime.now(timezone.utc).isoformat(timespec="seconds"), "token": self.token}
        for _ in range(80):  # a takeover in progress (its guard is gone in ms), a damaged lock aging (2 s)
            try:
                made = self._create(me)
            except OSError as exc:  # read-only, no permission, no space: the user's to fix
                fix = "free space there (or have the quota raised)" if exc.errno in NO_SPACE else "make it writable"
                raise ConfigError(f"cannot write run directory {self.path.parent} ({exc.strerror}): {fix} or pick "
                                  f"another --run-dir (nothing there was touched)") from None
            if not made:
                holder, age = self._holder()
                if holder is not None and holder.get("damaged") and not self._stale(holder, age):
                    time.sleep(DAMAGED_STALE_S / 20)  # being written (no hard links), or soon a crash's
                    continue
                if holder is not None and not self._stale(holder, age):
                    raise ConfigError(
                        f"run directory {self.path.parent} is in use by another workflow: host "
                        f"{holder.get('host')}, PID {holder.get('pid')}, since {holder.get('since')}. Wait for it "
                        f"to finish or use another run directory (a crashed holder's lock is taken over "
                        f"automatically: at once on its host, after {STALE_S:.0f} s elsewhere)") from None
                self._take_over()  # stale (or damaged)
                continue
            threading.Thread(target=self._beat, daemon=True).start()
            return self
        raise ConfigError(f"run directory {self.path.parent}: could not take its lock {self.path}")

    def _create(self, me: dict) -> bool:
        """The lock, made whole in one step; False when one exists."""
        written = self.path.with_name(f"{LOCK}.{self.token}")
        try:
            written.write_text(json.dumps(me))
            try:
                os.link(written, self.path)
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                    raise
                try:  # no hard links here: O_EXCL, then the content
                    fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                except FileExistsError:
                    return False
                with os.fdopen(fd, "w") as f:
                    json.dump(me, f)
            return True
        finally:
            written.unlink(missing_ok=True)

    def _holder(self) -> tuple[dict | None, float]:
        try:
            age = time.time() - self.path.stat().st_mtime
            holder = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None, 0.0
        except (OSError, ValueError):  # empty or garbage: a crash's (a lock is written whole)
            return {"damaged": True}, age if "age" in locals() else 0.0
        return (holder if isinstance(holder, dict) else {"damaged": True}), age

    @staticmethod
    def _stale(holder: dict, age: float) -> bool:
        if holder.get("damaged"):
            return age > DAMAGED_STALE_S
        if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
            return not _alive(holder["pid"], holder.get("started"))
        return age > STALE_S

    def _take_over(self) -> None:
        """Remove a stale lock, one taker at a time: under the takeover guard (O_EXCL too) the lock
        is judged again, so a taker that judged it stale a moment ago cannot remove the fresh lock
        another taker has made since. A guard older than TAKEOVER_STALE_S belongs to a crashed taker."""
        guard = self.path.with_name(TAKEOVER)
        try:
            os.close(os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            with contextlib.suppress(OSError):
                if time.time() - guard.stat().st_mtime > TAKEOVER_STALE_S:
                    guard.unlink()
            time.sleep(0.05)
            return
        try:
            holder, age = self._holder()
            if holder is not None and self._stale(holder, age):
                self.path.unlink(missing_ok=True)
        finally:
            guard.unlink(missing_ok=True)

    def _ours(self) -> bool:
        with contextlib.suppress(OSError, ValueError):
            return json.loads(self.path.read_text()).get("token") == self.token
        return False

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            if self._ours():
                with contextlib.suppress(OSError):
                    os.utime(self.path)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ours():
            self.path.unlink(missing_ok=True)
