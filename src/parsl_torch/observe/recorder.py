"""What a stage's Python processes read, seen as they read it (PEP 578 audit hooks).

Installed in every Python process a stage starts (its ranks and their children: the shim writes
a ``sitecustomize.py`` (``BOOT``) into the rank's node-local folder and puts it first on their
``PYTHONPATH``; forked children keep the hook). Each process appends a line per new thing it
reads to its own file in that folder, at once, so a worker ended by ``os._exit`` or a kill loses
nothing:

* ``f PATH``: a file opened for reading (``open``, ``os.open``, ``io.open_code``: code too;
  ``h5py.File``, whose C library opens files itself; ``np.load``/``np.memmap`` open through Python),
  or looked for by the user's code and not found (``os.path.exists``: its appearing is a change);
* ``m PATH``/``k PATH``: a path whose metadata (size, time, kind) or kind alone (``os.path.exists``) the
  user's code looked at; ``d PATH``: a directory listed (``os.listdir``, ``os.scandir``, ``glob``);
* ``e NAME``: an environment variable read by name by the user's code, or by a package it called
  (OmegaConf's ``${oc.env:X}``; not a package's own settings, read while it is imported, nor the
  session's variables a package reads: ``PATH``, ``HOME``...); ``e *``: the whole environment read
  by the user's code (``dict(os.environ)``, ``os.environ.copy()``); ``os.environb`` alike;
* ``t STATE PATH``: a file's state (mtime, size, inode) when the process first read it, against which
  its state at the stage's end is compared (a file changed while the stage ran makes no skip
  promise), and ``w PATH``: a file the stage opened to write (its own change is no one else's;
  ``W PATH``: a folder it wrote more than ``MANY`` files into);
* ``x WHY``: a Python child that the user's code started without this observer (``-I``, ``-S``,
  ``-E``, or a ``PYTHONPATH`` of its own): what it reads is not seen, so the stage makes no skip
  promise. ``sqlite3.connect`` is a read and a write of its database file.

Not recorded, being compared otherwise or being no input: the standard library, installed
packages, parsl-torch itself, the compilers' and matplotlib's caches, ``/proc``, ``/sys``, ``/dev``,
and in the temporary folders (``$TMPDIR``, else ``/tmp``; ``/var/tmp``) what was made or changed
since the call began (its scratch: a file there from before, or one looked for and not found, is an input
like any other). The shim merges a
rank's files (``reads_of``); the workflow keeps what a stage read (``apps.identity.reads``).
It imports the standard library only, and is loaded by its path, not through the package: it
runs at every interpreter's start (about 10 ms).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping

try:
    from . import watches as _watches
except ImportError:  # loaded by its path (a rank's sitecustomize, before any package): its sibling the same way
    import importlib.util as _util

    _spec = _util.spec_from_file_location("parsl_torch_observe_watches",
                                          os.path.join(os.path.dirname(os.path.abspath(__file__)), "watches.py"))
    _watches = _util.module_from_spec(_spec)  # type: ignore[arg-type]
    _spec.loader.exec_module(_watches)  # type: ignore[union-attr]

#: a folder with more files read than this is recorded as the folder with every file in it (``F PATH``)
MANY = 256
#: an audit event of our own: a warm rank starts its next call (what the recorder saw so far is the last call's)
BEGIN = "parsl-torch: observe: begin"
#: the audit event that tells the recorder that this thread reads for parsl-torch itself (True) or no longer
QUIET = "parsl-torch: observe: quiet"
#: the ``sitecustomize.py`` of a rank's processes (``boot_folder``): the standard library and this file only
BOOT = """# parsl-torch: observe what this process reads (observe/recorder.py), then the sitecustomize this one hides
import importlib.machinery, importlib.util, os, sys
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_hidden = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
try:
    _spec = importlib.util.spec_from_file_location("parsl_torch_observe", {observe!r})
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    _module.install({folder!r}, {since!r})
except (ImportError, OSError):
    pass
if _hidden is not None and _hidden.loader is not None:
    _hidden.loader.exec_module(importlib.util.module_from_spec(_hidden))
"""
#: the first line of every observed process's file
STARTED = "s"
#: the import system's frames: a package reading the environment under them is reading its own settings
_IMPORTING = ("<frozen importlib", os.path.join(os.path.dirname(os.__file__), "importlib", ""))
# What is not a stage's input, the one list of it: the observed processes apply it as they read, the
# workflow as it compares (``apps.identity``). Each variable is in the first group that names it:
#: set by a launch for each rank (and by parsl-torch for its processes): never an input, whoever reads it
LAUNCH_NAMES = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                          "MASTER_ADDR", "MASTER_PORT"})
LAUNCH_PREFIXES = ("PMI_", "PMIX_", "PALS_", "OMPI_", "MPI_LOCAL", "MPICH_", "HYDRA_", "SLURM_", "PBS_", "PARSL_",
                   "TORCHELASTIC_", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                   "ZE_AFFINITY_MASK")  # (the last four: core.claim.VISIBILITY, which a launch narrows per stage)
#: the session's (the terminal's, the shell's, the interpreter's): not an input when a stage reads the whole
#: environment (``dict(os.environ)``) or a package reads one; your own code's read of one by its name is
SESSION_NAMES = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "TMPDIR", "TMP", "TEMP", "OMP_NUM_THREADS", "TERM",
                           "COLORTERM", "DISPLAY", "LS_COLORS", "MAIL", "WINDOWID", "STY", "HOSTNAME"})
SESSION_PREFIXES = ("PYTHON", "SSH_", "XDG_", "DBUS_", "TMUX", "TERM_", "LC_TERMINAL", "VSCODE_", "KITTY_", "ITERM_")
#: the process's settings, which packages read for themselves: not an input when a package reads one; your
#: own code's read of one, by its name or of the whole environment, is
PROCESS_NAMES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "COLUMNS", "LINES", "TZ",
                           "NO_COLOR"})
PROCESS_PREFIXES = ("LC_",)


def launch_variable(name: str) -> bool:
    """Never an input (``LAUNCH_*``)."""
    return name in LAUNCH_NAMES or name.startswith(LAUNCH_PREFIXES)


def session_variable(name: str) -> bool:
    """Not an input when the whole environment is read (``LAUNCH_*``, ``SESSION_*``)."""
    return launch_variable(name) or name in SESSION_NAMES or name.startswith(SESSION_PREFIXES)


def package_setting(name: str) -> bool:
    """Not an input when a package reads it (every group)."""
    return session_variable(name) or name in PROCESS_NAMES or name.startswith(PROCESS_PREFIXES)


_EVENTS = frozenset({"open", "os.listdir", "os.scandir", "sqlite3.connect", "subprocess.Popen", "os.exec",
                     "os.posix_spawn", BEGIN, QUIET})


def skipped_places() -> tuple[str, ...]:
    import site

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # parsl_torch itself
    stdlib = os.path.dirname(os.__file__)
    packages = [*site.getsitepackages(), site.getusersitepackages(),
                *{os.path.join(p, "lib") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}]
    home = os.path.expanduser("~")
    caches = [os.environ.get(v) for v in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "MPLCONFIGDIR")]
    caches += [os.path.join(home, p) for p in (".triton", ".nv", ".cache/matplotlib", ".config/matplotlib")]
    places = [here, stdlib, *packages, *(c for c in caches if c), "/proc", "/sys", "/dev"]
    inductor = [os.path.join(t, "torchinductor_") for t in temp_folders()]  # (torch.compile's, by user name)
    return (*_both(places), *inductor)


def temp_folders(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Where a stage's scratch goes (in ``environ``, default this process's): only what is older than its call
    there is an input."""
    return _both([(os.environ if environ is None else environ).get("TMPDIR") or "/tmp", "/var/tmp"])


def _both(places: list[str]) -> tuple[str, ...]:
    return tuple({os.path.join(f(p), "") for p in places for f in (os.path.realpath, os.path.abspath)})


@contextlib.contextmanager
def unobserved() -> Iterator[None]:
    """What this thread reads meanwhile is parsl-torch's, not the stage's: a failed rank's traceback reads
    the sources it quotes (``linecache``), which must not make the workflow script an input of the stage.
    (An audit event: the recorder is a copy of this module loaded by its path, with state of its own.)"""
    sys.audit(QUIET, True)
    try:
        yield
    finally:
        sys.audit(QUIET, False)


class Recorder:
    """One process's reads: each new one appended at once to ``<folder>/<pid>.txt``."""

    def __init__(self, folder: str, since: float) -> None:
        self.folder, self.skipped, self.temp = folder, (*skipped_places(), "<frozen"), temp_folders()
        self.ours = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")  # parsl_torch/
        self.stdlib = (os.path.join(os.path.dirname(os.__file__), ""), "<frozen")
        self.since = since  # when the call began (the shim's start; a warm rank's next call)
        #: code that lists sys.path's folders to find modules and installed packages (importlib.metadata)
        self.finders = ("<frozen", os.path.join(os.path.dirname(os.__file__), "importlib", ""))
        self.seen: set[str] = set()
        self.local = threading.local()  # (set while the recorder itself opens its file)
        self.lock = threading.Lock()
        self.out: int | None = None
        self.below = _watches.Below(self.line)

    def hook(self, event: str, args: tuple) -> None:
        if event not in _EVENTS:
            return
        if event in ("os.listdir", "os.scandir"):
            self.below.lists(args[0])  # (the preloaded observer leaves Python's listings to this one)
        if event == QUIET:
            self.local.quiet = bool(args[0])
            self.below.quiet(int(self.local.quiet))
        if getattr(self.local, "busy", False) or getattr(self.local, "quiet", False):
            return
        if event == BEGIN:
            self.begin()
        elif event == "open":
            path, mode, flags = args
            if isinstance(path, int):
                return
            reads, writes = _watches.access(mode, flags)
            if writes:
                self.note("w", path)
            if reads:
                self.note("f", path)
        elif event == "sqlite3.connect":
            self.database(args[0])
        elif event in ("subprocess.Popen", "os.exec", "os.posix_spawn"):
            self.child(*args[:2], args[-1])
        elif args[0] is not None and not isinstance(args[0], int) and \
                not sys._getframe(1).f_code.co_filename.startswith(self.finders):
            self.note("d", args[0])  # (not the import system's: the modules it finds are recorded as files)

    def database(self, name: object) -> None:
        """SQLite opens its file in C: it is read, and may be written by the stage itself."""
        if isinstance(name, (str, bytes, os.PathLike)):
            text = os.fsdecode(name)
            text = text[len("file:"):].split("?", 1)[0] if text.startswith("file:") else text
            if text and text != ":memory:":
                self.note("w", text)
                self.note("f", text)

    def child(self, program: object, argv: object, env: object) -> None:
        """A child the user's code starts: a Python without this observer reads unseen, a program other than
        Python reads its whole environment."""
        said = _watches.child_lines(program, argv, os.environ if env is None else env, os.path.join(self.folder, "boot"))
        if said and _reader(self, 2) == "user":
            self.line(said)

    def note(self, kind: str, path: object) -> None:
        try:
            text = os.fsdecode(os.fspath(path))  # type: ignore[arg-type]
        except TypeError:
            return
        text = _watches.resolved(text)
        if kind == "w" and _in_cache_folder(text):
            return  # a module's cache (or its temporary) written is Python's doing: no write of its source
        full = _source_of(text)
        inside = os.path.join(full, "")
        if inside.startswith(self.skipped) or inside.startswith(self.folder):
            return
        line = f"{kind} {full}"
        if line in self.seen or (inside.startswith(self.temp) and _made_since(full, self.since)):
            return
        if kind == "f" and (state := file_state(full)) is not None:
            self.line(f"t {state} {full}")
        self.line(line)

    def line(self, text: str) -> None:
        if text in self.seen:
            return
        self.local.busy = True
        try:
            with contextlib.suppress(OSError), self.lock:  # a folder gone: the shim ended; nothing is left to tell
                if self.out is None:
                    self.out = os.open(os.path.join(self.folder, f"{os.getpid()}.txt"),
                                       os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                os.write(self.out, (text + "\n").encode("utf-8", "surrogateescape"))
                self.seen.add(text)
        finally:
            self.local.busy = False

    def begin(self) -> None:
        """Forget what was seen: the next call's reads are recorded anew (into a fresh file), against the
        places of its environment (a warm call's fork sets the call's ``TMPDIR``, caches, ...)."""
        self.since = time.time()
        self.skipped, self.temp = (*skipped_places(), "<frozen"), temp_folders()
        self.below.begin(self.skipped, self.temp, self.since)
        with self.lock:
            if self.out is not None:
                os.close(self.out)
            self.out = None
            self.seen.clear()

    def after_fork(self) -> None:
        """A forked child writes its own file (what its parent saw is in the parent's)."""
        self.out = None
        self.lock = threading.Lock()


def _source_of(path: str) -> str:
    """A module's compiled cache (``pkg/__pycache__/mod.cpython-312.pyc``) stands for its source
    (``pkg/mod.py``), which is what an edit changes: the cache follows only at the next import."""
    if not path.endswith(".pyc") or not _in_cache_folder(path):
        return path
    folder, name = os.path.split(path)
    return os.path.join(os.path.dirname(folder), name.split(".", 1)[0] + ".py")


def _in_cache_folder(path: str) -> bool:
    """Whether ``path`` is in a folder of Python's compiled caches."""
    return os.path.basename(os.path.dirname(path)) == "__pycache__"


def _made_since(path: str, since: float) -> bool:
    """A file or folder the call made or changed itself: scratch, not an input (one that is not there is
    looked for: an input, as elsewhere)."""
    with contextlib.suppress(OSError):
        return os.stat(path).st_ctime >= since
    return False


def file_state(path: str) -> str | None:
    """A file's state, as ``t`` lines record it: what a change of its content changes (None: no such file)."""
    with contextlib.suppress(OSError):
        st = os.stat(path)
        return f"{st.st_mtime_ns}:{st.st_size}:{st.st_ino}"
    return None


def _reader(recorder: Recorder, depth: int) -> str | None:
    """Who reads the environment: "user" (your code), "package" (a package your code called while it runs:
    OmegaConf's ``${oc.env:X}``, Hydra's), None (parsl-torch; a package while it is imported: its settings)."""
    frame, package = sys._getframe(depth + 1), False  # (``depth``: frames between the read and this function)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(recorder.ours) or (package and name.startswith(_IMPORTING)):
            return None
        if name.startswith(recorder.skipped):  # (the standard library and frozen modules: on behalf of a caller)
            package = package or not name.startswith(recorder.stdlib)
        else:
            return "package" if package else "user"
        frame = frame.f_back
    return None


def install(folder: str, since: float) -> Recorder:
    """Observe this process (and its forked children) into ``folder``; ``since``: when the call began."""
    recorder = Recorder(os.path.join(os.path.abspath(folder), ""), since)
    sys.addaudithook(recorder.hook)
    os.register_at_fork(after_in_child=recorder.after_fork)
    _watches.watch_environ(recorder, lambda depth: _reader(recorder, depth + 1), package_setting)
    _watches.watch_h5py(recorder)
    _watches.watch_lookups(recorder, lambda depth: _reader(recorder, depth + 1) == "user")
    recorder.line(STARTED)  # (a rank whose Python could not observe writes nothing: its shim tells)
    return recorder


def begin_call(folder: str) -> None:
    """A warm rank's next call, in its parent: the folder emptied and this process's recorder told (no
    handle on it is kept anywhere: it hears its own audit event). The call's fork says ``begin_reads``."""
    for name in _files(folder):
        os.unlink(os.path.join(folder, name))
    sys.audit(BEGIN)


def begin_reads() -> None:
    """This process's reads from now on are a new call's, against its environment as it is now."""
    sys.audit(BEGIN)


def _files(folder: str) -> list[str]:
    """The processes' files (``<pid>.txt``; not the boot folder)."""
    return [name for name in os.listdir(folder) if name.endswith(".txt")]


def reads_of(folder: str) -> set[str]:
    """The lines of every process's file in a rank's folder, with folders of many files read taken whole
    (``F PATH``: the folder and every file in it)."""
    lines: set[str] = set()
    for name in _files(folder):
        with open(os.path.join(folder, name), encoding="utf-8", errors="surrogateescape") as f:
            lines.update(line.rstrip("\n") for line in f if line.strip())
    return _folded(lines - {STARTED})


def observed_any(folder: str) -> bool:
    """Whether any process of the rank was observed (a Python without parsl-torch leaves nothing)."""
    return bool(_files(folder))


def _folded(lines: Iterable[str]) -> set[str]:
    """Folders with more than ``MANY`` files read kept as the folder (``F``: their files' states go), and
    with more than ``MANY`` files written as the folder (``W``)."""
    lines = set(lines)
    many = {kind: _crowded(lines, kind) for kind in "fw"}  # (a file's metadata looked at counts as read: ``m``)
    return {line for line in lines if _folder_of(line) not in many.get("w" if line[0] == "w" else "f", ())} | \
        {f"F {folder}" for folder in many["f"]} | {f"W {folder}" for folder in many["w"]}


def _crowded(lines: set[str], kind: str) -> set[str]:
    by_folder = Counter(_folder_of(line) for line in lines if line[0] == kind or (kind == "f" and line[0] in "mk"))
    return {folder for folder, n in by_folder.items() if n > MANY}


def _folder_of(line: str) -> str | None:
    """The folder of a file line's path (``f``, ``w``, ``t``); None for the others."""
    if line[:2] in ("f ", "w ", "m ", "k "):
        return os.path.dirname(line[2:])
    return os.path.dirname(line.split(" ", 2)[2]) if line.startswith("t ") else None


def boot_folder(folder: str) -> str:
    """Write the rank's ``sitecustomize.py`` into ``<folder>/boot`` (to go first on the ranks' ``PYTHONPATH``):
    it loads this file by its path and observes into ``folder``, then runs the ``sitecustomize`` it hides."""
    boot = os.path.join(folder, "boot")
    os.mkdir(boot, 0o700)
    with open(os.path.join(boot, "sitecustomize.py"), "w") as f:
        f.write(BOOT.format(observe=os.path.abspath(__file__), folder=folder, since=time.time()))
    return boot
