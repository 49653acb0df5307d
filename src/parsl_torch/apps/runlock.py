"""One workflow per run directory at a time, on any shared file system.

``<run_dir>/.lock`` is created with O_EXCL (atomic on local disks, Lustre,
GPFS and NFSv3+, unlike ``flock`` across nodes) and holds the holder's host,
PID, process start time and start date. The holder touches it every
HEARTBEAT_S seconds. A lock is stale, and taken over without anyone's help,
when its holder is gone: on the same host, its process no longer exists (or
is another process with the same PID); from another host, the lock has not
been touched for STALE_S seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from ..errors import ConfigError

LOCK = ".lock"
HEARTBEAT_S = 30.0
STALE_S = 300.0


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (tells a reused PID apart)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process, but it exists
    return started is None or _start_time(pid) in (None, started)


class RunLock:
    """``with RunLock(run_dir):`` holds the run directory or fails at once naming the holder."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK
        self.token = secrets.token_hex(8)
        self._stop = threading.Event()

    def __enter__(self) -> RunLock:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "started": _start_time(os.getpid()),
              "since": datetime.now(timezone.utc).isoformat(timespec="seconds"), "token": self.token}
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder, age = self._holder()
                if holder is not None and not self._stale(holder, age):
                    raise ConfigError(
                        f"run directory {self.path.parent} is in use by another workflow: host "
                        f"{holder.get('host')}, PID {holder.get('pid')}, since {holder.get('since')}. Wait for it "
                        f"to finish or use another run directory (a crashed holder's lock is taken over "
                        f"automatically: at once on its host, after {STALE_S:.0f} s elsewhere)") from None
                # stale (or unreadable and old): move it aside; of several takers only one rename succeeds
                with contextlib.suppress(FileNotFoundError):
                    aside = self.path.with_name(f"{LOCK}.stale.{self.token}")
                    os.rename(self.path, aside)
                    aside.unlink()
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            threading.Thread(target=self._beat, daemon=True).start()
            return self
        raise ConfigError(f"run directory {self.path.parent}: could not take its lock {self.path}")

    def _holder(self) -> tuple[dict | None, float]:
        try:
            age = time.time() - self.path.stat().st_mtime
            holder = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None, 0.0
        except (OSError, ValueError):  # being written right now, or garbage: stale once old
            return {"host": "?", "pid": "?", "since": "just now"}, age if "age" in locals() else 0.0
        return (holder if isinstance(holder, dict) else {}), age

    @staticmethod
    def _stale(holder: dict, age: float) -> bool:
        if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
            return not _alive(holder["pid"], holder.get("started"))
        return age > STALE_S

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
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
