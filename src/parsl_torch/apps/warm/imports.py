"""Rank 0 of a warm group: the user modules its process imported, with their file's size, mtime and
ctime as they were imported. A call's identity reads the module files as they are when the call is ready; a
warm rank runs the code it imported, maybe hours before. Should they differ (a helper edited while a
long sweep runs), the group must not take the call: its result would be recorded under code it did
not run, and the next run would skip it. Fresh ranks take it instead. An extension module built in
place (a custom kernel rebuilt) counts as well: a process cannot load it again."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import Any

from ..identity.digests import recently_written, sha
from ..identity.usercode import find_spec, is_user_extension, is_user_file


class ImportWatch:
    """Put first on ``sys.meta_path``: sees each import as it is found (it finds nothing itself) and keeps
    the user's module files' (size, mtime, ctime; a recently written one's content digest) of that moment."""

    def __init__(self) -> None:
        self.imported: dict[str, tuple[int, int, int, str | None] | None] = {}
        self._looking = threading.local()  # (looking consults the other import hooks, never itself)
        sys.meta_path.insert(0, self)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if getattr(self._looking, "now", False):
            return None
        self._looking.now = True
        try:
            with contextlib.suppress(Exception):  # (an import this cannot follow is the import system's to fail)
                origin = getattr(find_spec(name, path), "origin", None)
                if origin and (is_user_file(origin) or is_user_extension(origin)):
                    self.imported[os.path.realpath(origin)] = _stat(origin)
        finally:
            self._looking.now = False
        return None

    def changed(self) -> str | None:
        """A user module file this process imported that is not as it was then (None: none)."""
        return next((file for file, seen in self.imported.items() if _differs(file, seen)), None)


def _stat(path: str) -> tuple[int, int, int, str | None] | None:
    """(size, mtime, ctime (a copy that puts the old mtime back still changes it), and the content's digest if
    it was written within digests.RACY_S: a rewrite within the same whole-second mtime of Lustre or NFS keeps
    the size and mtime)."""
    try:
        st = os.stat(path)
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                sha(Path(path).read_bytes()) if recently_written(st) else None)
    except OSError:
        return None


def _differs(path: str, seen: tuple[int, int, int, str | None] | None) -> bool:
    now = _stat(path)
    if now is None or seen is None:
        return now != seen
    if now[:3] != seen[:3]:
        return True
    return seen[3] is not None and sha(Path(path).read_bytes()) != seen[3]
