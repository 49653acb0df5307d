"""File digests and parsed modules of one run directory, remembered by size, mtime, ctime and inode
(``<run_dir>/parsl/input-digests.json``, shared by the workflow and its workers)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

from ...common import settings
from ...common.files import write_atomic
from ..stage.scriptargs import is_pattern, pattern_files
from . import usercode

#: in a run's parsl/ folder: the digests of its files and modules
DIGESTS = "input-digests.json"
#: a file modified less than this many seconds before it is hashed is hashed again next time, not
#: remembered: a rewrite of the same size within the same mtime (Lustre's and NFS's are whole seconds)
#: would keep its size, mtime and inode (git's "racily clean" entries)
RACY_S = 2.0


def sha(data: bytes) -> str:
    """The SHA-256 hex digest every identity component is written as."""
    return hashlib.sha256(data).hexdigest()


def recently_written(st: os.stat_result) -> bool:
    """Written less than RACY_S ago: what is read of it now may change again under the same stat."""
    return time.time() - st.st_mtime <= RACY_S


def _stat_key(st: os.stat_result) -> str:
    """What a file's remembered digest stands on: its ctime too, as git's index, so a rewrite that puts the
    old mtime back (``rsync -t``, ``cp -p``, ``touch -r``, ``os.utime``) is read again."""
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"


class DigestCache:
    """File digests and parsed modules of one run directory, remembered by size, mtime and inode.

    Read once, written once per ``save`` (merged with what another process wrote meanwhile)."""

    def __init__(self, path: str | os.PathLike | None, run_dir: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path is not None else None
        #: left out of a directory's digest: the run's own files are outputs, and change on every run
        self.run_dir = os.path.realpath(run_dir) if run_dir is not None else None
        self._known: dict[str, Any] | None = None
        self._dirty: dict[str, Any] = {}
        self._lock = threading.RLock()

    @classmethod
    def of_run_dir(cls, run_dir: str | os.PathLike) -> DigestCache:
        return cls(Path(run_dir) / "parsl" / DIGESTS, run_dir)

    def _entry(self, key: str, stat: str) -> Any:
        with self._lock:
            if self._known is None:
                self._known = _read_json(self.path)
            entry = self._known.get(key)
            return entry if isinstance(entry, dict) and entry.get("stat") == stat else None

    def _remember(self, key: str, entry: dict[str, Any]) -> None:
        with self._lock:
            assert self._known is not None
            self._known[key] = self._dirty[key] = entry

    def file_digest(self, path: str | os.PathLike) -> str:
        """The content digest of a file (stat-based for a directory, or with PARSL_TORCH_INPUT_HASH=stat);
        "missing" if it does not exist; a device or pipe by its kind (it is never read)."""
        path = os.path.abspath(path)
        try:
            st = os.stat(path)
        except OSError:
            return self._pattern_digest(path) if is_pattern(path) else "missing"
        if stat.S_ISDIR(st.st_mode):
            return "dir:" + sha(json.dumps(self._tree(path)).encode())
        if not stat.S_ISREG(st.st_mode):
            return f"special:{stat.S_IFMT(st.st_mode)}"
        key = _stat_key(st)
        if settings.INPUT_HASH.get() == "stat":
            return f"stat:{key}"
        entry = self._entry(path, key)
        if entry is not None:
            return entry["sha256"]
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if not recently_written(st):  # else it may change again within the same mtime: hash it again
            self._remember(path, {"stat": key, "sha256": digest})
        return digest

    def _tree(self, path: str) -> list[tuple[str, int, int, int]]:
        """(relative path, size, mtime, ctime) of each file under a directory, in order (ctime: a file
        replaced by ``cp -p`` keeps size and mtime); hidden folders, ``__pycache__`` and the run
        directory left out."""
        found = []
        for top, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__"
                             and os.path.realpath(os.path.join(top, d)) != self.run_dir)
            for name in sorted(files):
                with contextlib.suppress(OSError):
                    st = os.stat(os.path.join(top, name))
                    found.append((os.path.relpath(os.path.join(top, name), path), st.st_size, st.st_mtime_ns,
                                  st.st_ctime_ns))
        return found

    def _pattern_digest(self, pattern: str) -> str:
        """A glob pattern's input: its matches, each by its size and mtime (as a directory's files; those in
        the run directory left out, as from a directory: a stage's own outputs must not change its input)."""
        inside = os.path.join(self.run_dir, "") if self.run_dir else None
        found = []
        for path in pattern_files(pattern):
            with contextlib.suppress(OSError):
                if inside is None or not os.path.realpath(path).startswith(inside):
                    st = os.stat(path)
                    found.append((path, st.st_size, st.st_mtime_ns))
        return "glob:" + sha(json.dumps(found).encode()) if found else "missing"

    def module(self, path: str) -> usercode.ParsedModule:
        """``usercode.parse_module``, cached."""
        st = os.stat(path)
        key = _stat_key(st)
        entry = self._entry("py:" + path, key)
        if entry is not None:
            return usercode.ParsedModule(entry["ast"], entry["imports"])
        parsed = usercode.parse_module(Path(path).read_bytes(), path)
        if not recently_written(st):  # (as a file's digest)
            self._remember("py:" + path, {"stat": key, "ast": parsed.digest, "imports": parsed.imports})
        return parsed

    def save(self) -> None:
        with self._lock:
            if not self._dirty or self.path is None:
                return
            merged = {**_read_json(self.path), **self._dirty}
            with contextlib.suppress(OSError):  # a cache: a read-only run directory only costs time
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(self.path, json.dumps(merged, indent=0, sort_keys=True))
                self._dirty = {}


def _read_json(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    return {}


def file_digest(path: str | os.PathLike, cache: str | os.PathLike | None = None) -> str:
    """One file's digest, cached in the file ``cache`` (a DIGESTS file)."""
    digests = DigestCache(cache)
    try:
        return digests.file_digest(path)
    finally:
        digests.save()
