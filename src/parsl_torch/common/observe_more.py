"""What ``observe`` watches beyond audit events, in a file of its own that it loads the way it is loaded
itself (the standard library only): ``h5py.File`` (the HDF5 library opens files in C), paths the user's
code looks for and does not find, and whether a Python child that a process starts will load the
observer at all.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

def access(mode: object, flags: object) -> tuple[bool, bool]:
    """Whether an ``open`` audit event's mode (or ``os.open``'s flags) reads, and whether it writes: one
    call per open of every observed process."""
    if isinstance(mode, str):
        plus = "+" in mode
        return "r" in mode or plus, plus or "w" in mode or "a" in mode or "x" in mode
    if not isinstance(flags, int):
        return False, False
    how = flags & os.O_ACCMODE
    return how != os.O_WRONLY, how != os.O_RDONLY


#: a Python's options that drop the observer (its ``sitecustomize`` on ``PYTHONPATH``): isolated, no site, no PYTHON*
UNOBSERVED_FLAGS = frozenset("ISE")


def _options(args: list[str]) -> set[str]:
    """The one-letter options of a Python command line's interpreter part (before the script, ``-c``, ``-m``)."""
    letters: set[str] = set()
    takes_value = False
    for arg in args:
        if takes_value:
            takes_value = False
            continue
        if not arg.startswith("-") or arg in ("-", "--") or arg.startswith("--"):
            break
        for i, letter in enumerate(arg[1:]):
            if letter in "cm":  # (the rest is its value: the code or the module)
                return letters
            letters.add(letter)
            if letter in "XW":
                takes_value = i == len(arg) - 2  # (-X dev: the next argument; -Xdev: this one)
                break
    return letters


def drops_observer(program: object, argv: object, env: object, boot: str) -> str | None:
    """Why a child started as ``program argv`` with ``env`` is a Python that this observer will not load in
    (None: not a Python, or one that loads it)."""
    try:
        args = [os.fsdecode(a) for a in ([argv] if isinstance(argv, (str, bytes)) else list(argv or ()))]
        name = os.path.basename(os.fsdecode(program if program is not None else args[0]))
    except (TypeError, IndexError):
        return None
    if not name.startswith("python"):
        return None
    shown = " ".join(args)[:200]
    if flags := _options(args[1:]) & UNOBSERVED_FLAGS:
        return f"a Python child started with -{''.join(sorted(flags))}, which does not load the observer: {shown}"
    folders = (_variable(env, "PYTHONPATH") or "").split(os.pathsep)
    if not any(os.path.abspath(f or ".") == os.path.abspath(boot) for f in folders):
        return f"a Python child started with a PYTHONPATH without the observer's folder: {shown}"
    return None


def _variable(env: object, name: str) -> str | None:
    """``name`` in a child's environment, whose keys may be str or bytes (None: not there)."""
    for key in (name, name.encode()):
        try:
            value = env.get(key)  # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            continue
        if value is not None:
            return os.fsdecode(value)
    return None


def watch_h5py(recorder: Any) -> None:
    """h5py's files are opened by the HDF5 library, not Python: ``h5py.File`` is wrapped where it is defined."""

    class Finder:  # (a meta path finder: importlib.abc costs 17 ms at every start)
        def find_spec(self, name, path, target=None):
            if name != "h5py._hl.files":
                return None
            sys.meta_path.remove(self)
            try:
                import importlib.util

                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                opened = module.File.__init__

                def init(self, name, mode="r", *args, **kwargs):
                    if isinstance(name, (str, bytes, os.PathLike)) and mode in ("r+", "a", "w", "w-", "x"):
                        recorder.note("w", name)  # (a file it changes itself: not changed under it)
                    if isinstance(name, (str, bytes, os.PathLike)) and mode in ("r", "r+", "a", None):
                        recorder.note("f", name)
                    opened(self, name, mode, *args, **kwargs)

                module.File.__init__ = init

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())


def watch_lookups(recorder: Any, by_user: Callable[[int], bool]) -> None:
    """A path the user's code looks for and does not find (``os.path.exists(override)`` is False,
    ``Path.is_file()``, ``os.stat`` raising) is recorded as a read of it: its digest is "missing", so the file
    appearing later is a change. ``os.stat`` and ``os.lstat`` are wrapped where the user's code and the
    standard library call them (the import system calls its own: its misses are not recorded); ``by_user(n)``:
    whether the code ``n`` frames above the caller is the user's (a package's lookups are its own business)."""

    def wrapped(real: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(real)
        def looked_up(path: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return real(path, *args, **kwargs)
            except FileNotFoundError:
                if not isinstance(path, int) and not getattr(recorder.local, "busy", False) and by_user(1):
                    recorder.note("f", path)
                raise

        for supports in (os.supports_dir_fd, os.supports_fd, os.supports_follow_symlinks):  # (shutil asks them)
            if real in supports:
                supports.add(looked_up)
        return looked_up

    os.stat, os.lstat = wrapped(os.stat), wrapped(os.lstat)
