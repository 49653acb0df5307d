"""What ``observe`` watches beyond audit events, in a file of its own that it loads the way it is loaded
itself (the standard library only): the environment's reads, ``h5py.File`` (the HDF5 library opens files
in C), paths the user's code looks for and does not find, whether a Python child that a process starts
will load the observer at all, and what the preloaded observer of compiled code must be told
(``observe.native``).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any


class Below:
    """The preloaded observer of compiled code in this process (``observe.native``; inert where it is not
    loaded), told what only Python knows: that this process observes itself (Python's lookups and listings
    are judged here: the import system's are no input), which listing is about to be Python's, and a warm
    rank's next call."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.library: Any = None
        if "parsl-torch-observe" not in os.environ.get("LD_PRELOAD", ""):
            return
        try:
            import ctypes  # (5 ms, only where the library is loaded)

            library = ctypes.CDLL(None)
            library.parsl_torch_observe_lists.argtypes = [ctypes.c_char_p]
            library.parsl_torch_observe_begin.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_double]
            library.parsl_torch_observe_quiet.argtypes = [ctypes.c_int]
            library.parsl_torch_observe_python()
            self.library = library
        except (OSError, AttributeError):  # (asked for and not loaded: what compiled code reads here is unseen)
            say(f"x the observer of compiled code did not load in {sys.executable} (LD_PRELOAD="
                f"{os.environ.get('LD_PRELOAD')})")

    def lists(self, path: object) -> None:
        """Python is about to list ``path`` (an ``os.listdir``/``os.scandir`` audit event's argument)."""
        if self.library is None:
            return
        try:
            self.library.parsl_torch_observe_lists(
                None if isinstance(path, int) else os.fsencode(os.fspath(path if path is not None else ".")))
        except TypeError:
            pass

    def quiet(self, on: int) -> None:
        """This thread reads for parsl-torch itself (1) or for the stage again (0)."""
        if self.library is not None:
            self.library.parsl_torch_observe_quiet(on)

    def begin(self, skipped: tuple[str, ...], temp: tuple[str, ...], since: float) -> None:
        """A warm rank's next call: the library forgets what it saw and takes the call's places."""
        if self.library is None:
            return
        self.library.parsl_torch_observe_begin(os.fsencode("\n".join(p for p in skipped if p.startswith(os.sep))),
                                               os.fsencode("\n".join(temp)), since)


#: the standard library's checks of a path's existence and kind, which learn nothing of its size or time
_EXISTENCE = frozenset({"exists", "lexists", "isfile", "isdir", "islink", "is_file", "is_dir", "is_symlink"})


def _existence(frame: Any) -> bool:
    """Whether the ``os.stat`` called from ``frame`` is an existence check (``os.path.exists``,
    ``Path.is_file``: through ``Path.stat``, one frame more)."""
    for _ in range(2):
        if frame is None or frame.f_code.co_name in _EXISTENCE:
            return frame is not None
        frame = frame.f_back
    return False


def resolved(path: str) -> str:
    """``path`` absolute, as the kernel resolves it: where it goes up (``..``) after a link, from the link's
    target (``d/lnk/../e.txt`` is not ``d/e.txt``); elsewhere lexically, as ``os.path.abspath``."""
    joined = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    if ".." not in joined or ".." not in joined.split(os.sep):  # (the substring first: one test on most paths)
        return os.path.normpath(joined)
    head, tail = os.path.split(joined)
    return os.path.realpath(joined) if tail == ".." else os.path.join(os.path.realpath(head), tail)


def access(mode: object, flags: object) -> tuple[bool, bool]:
    """Whether an ``open`` audit event's mode (or ``os.open``'s flags) reads what was there, and whether it
    writes: one call per open of every observed process. A file opened emptied or new (``w+``, ``x+``,
    ``O_TRUNC``, ``O_EXCL``: ``tempfile.mkstemp``) is written, not read: nothing of before is read there."""
    if isinstance(mode, str):
        plus, fresh = "+" in mode, "w" in mode or "x" in mode
        return "r" in mode or (plus and not fresh), plus or fresh or "a" in mode
    if not isinstance(flags, int):
        return False, False
    how = flags & os.O_ACCMODE
    return how != os.O_WRONLY and not flags & (os.O_TRUNC | os.O_EXCL), how != os.O_RDONLY


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


def child_lines(program: object, argv: object, env: object, boot: str) -> str | None:
    """What a child started as ``program argv`` with ``env`` makes the stage's reads: ``x WHY`` a Python that
    will not load this observer, ``e *`` a program other than Python (it reads its environment without a
    call: the whole of it is read); None: a Python that observes itself."""
    if (started := _started(program, argv)) is None:
        return None
    if not os.path.basename(started[0]).startswith("python"):
        return "e *"
    args = started[1]
    shown = " ".join(args)[:200]
    if flags := _options(args[1:]) & UNOBSERVED_FLAGS:
        return f"x a Python child started with -{''.join(sorted(flags))}, which does not load the observer: {shown}"
    folders = (_variable(env, "PYTHONPATH") or "").split(os.pathsep)
    if not any(os.path.abspath(f or ".") == os.path.abspath(boot) for f in folders):
        return f"x a Python child started with a PYTHONPATH without the observer's folder: {shown}"
    return None


def _started(program: object, argv: object) -> tuple[str, list[str]] | None:
    """(the program's path, its arguments) of a child's start event (None: not names)."""
    try:
        args = [os.fsdecode(a) for a in ([argv] if isinstance(argv, (str, bytes)) else list(argv or ()))]
        return os.fsdecode(program if program is not None else args[0]), args
    except (TypeError, IndexError):
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
    appearing later is a change; one it finds, as its metadata looked at (``m``: ``os.path.getsize``, sizes
    summed over a listing), or only its kind where that is all the check learns (``k``: ``os.path.exists``,
    ``Path.is_file``: a file since deleted is a change, a file rewritten is not). ``os.stat`` and ``os.lstat`` are wrapped where the user's code and the
    standard library call them (the import system calls its own: its misses are not recorded); ``by_user(n)``:
    whether the code ``n`` frames above the caller is the user's (a package's lookups are its own business)."""

    def wrapped(real: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(real)
        def looked_up(path: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                found = real(path, *args, **kwargs)
            except FileNotFoundError:
                if not isinstance(path, int) and not getattr(recorder.local, "busy", False) and by_user(1):
                    recorder.note("f", path)
                raise
            if not isinstance(path, int) and not getattr(recorder.local, "busy", False) and by_user(1):
                recorder.note("k" if _existence(sys._getframe(1)) else "m", path)  # (found: its metadata, or kind)
            return found

        for supports in (os.supports_dir_fd, os.supports_fd, os.supports_follow_symlinks):  # (shutil asks them)
            if real in supports:
                supports.add(looked_up)
        return looked_up

    os.stat, os.lstat = wrapped(os.stat), wrapped(os.lstat)


def watch_environ(recorder: Any, reader: Callable[[int], str | None], package_setting: Callable[[str], bool]) -> None:
    """Environment reads by name (``e NAME``) and of the whole (``e *``), by the user's code or a package it
    called: ``os.environ`` (and ``os.environb``) become a subclass that records them. ``reader(n)``: who
    reads, ``n`` frames above the caller ("user", "package", None)."""
    base = type(os.environ)

    def note(key: object) -> None:
        line = f"e {key}"
        if line not in recorder.seen and (who := reader(2)) is not None and \
                (who == "user" or not package_setting(str(key))):
            recorder.line(line)

    class Environ(base):  # type: ignore[misc,valid-type]
        def __getitem__(self, key):
            note(key)
            return base.__getitem__(self, key)

        def __contains__(self, key):
            note(key)
            return base.__contains__(self, key)

        def __iter__(self):
            if "e *" not in recorder.seen and reader(1) == "user":  # (a package copying it: a subprocess's)
                recorder.line("e *")
            return base.__iter__(self)

    os.environ.__class__ = Environ
    if hasattr(os, "environb"):  # (its keys are bytes: recorded as the names they are)
        base_b = type(os.environb)

        class EnvironB(base_b):  # type: ignore[misc,valid-type]
            def __getitem__(self, key):
                note(os.fsdecode(key))
                return base_b.__getitem__(self, key)

            def __contains__(self, key):
                note(os.fsdecode(key))
                return base_b.__contains__(self, key)

        os.environb.__class__ = EnvironB
