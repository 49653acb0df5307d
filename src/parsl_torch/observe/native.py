"""The observer below Python: ``native.c``, built with the system's C compiler on first use and
preloaded (``LD_PRELOAD``) into every process of an observed rank, Python or not.

It sees what compiled code reads (safetensors, tokenizers, pyarrow, sentencepiece, HDF5, a tool such as
``sort``), what a shell script or a binary stage reads, the paths such programs look for and do not find,
and the programs a stage starts; it writes into the rank's folder, in the Python observer's lines
(``observe.recorder``). Built once per source digest, machine and C library into the cache folder
(``PARSL_TORCH_CACHE_DIR``, shared by the nodes); where no compiler is found, Python's observation
alone applies and ``why_not`` says so.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..common import settings
from .recorder import skipped_places

SOURCE = Path(__file__).with_name("native.c")
#: in the library's file name: how a process's ``LD_PRELOAD`` is known to carry it
MARK = "parsl-torch-observe"


@lru_cache(maxsize=1)
def _built() -> tuple[str | None, str]:
    """(the library's path, "") or (None, why not)."""
    if platform.system() != "Linux":
        return None, f"the observer of compiled code preloads a library, which needs Linux ({platform.system()} here)"
    asked = os.environ.get("CC")
    compiler = shutil.which(asked) if asked else shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not compiler:
        return None, (f"CC={asked} is not a program found on PATH" if asked else "no C compiler (cc, gcc or clang)") + \
            ", to build the observer of compiled code"
    libc = " ".join(platform.libc_ver())
    key = hashlib.sha256(SOURCE.read_bytes() + f"|{platform.machine()}|{libc}".encode()).hexdigest()[:16]
    cache = Path(settings.CACHE_DIR.get()).expanduser()
    library = cache / f"{MARK}-{key}.so"
    if any(c in str(library) for c in " :\t\n"):  # (LD_PRELOAD's separators)
        return None, (f"the observer of compiled code would be kept in {cache}, whose path holds a space or a ':', "
                      f"which LD_PRELOAD cannot carry: set {settings.CACHE_DIR.name} to a folder without them")
    if library.is_file():
        return str(library), ""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        partial = cache / f".{library.name}.{os.getpid()}"
        out = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(SOURCE), "-ldl",
                              "-lpthread"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"the observer of compiled code could not be built in {cache}: {exc}"
    if out.returncode != 0:
        partial.unlink(missing_ok=True)
        first = (out.stderr.strip().splitlines() or ["no message"])[0]
        return None, f"the observer of compiled code did not build with {compiler}: {first}"
    os.replace(partial, library)  # (several nodes building at once: each file whole, the last one stays)
    return str(library), ""


def library() -> str | None:
    """The built library's path (None: none here; ``why_not`` says why)."""
    return _built()[0]


def why_not() -> str:
    return _built()[1]


def preload_env(library_path: str, environ: Mapping[str, str], skipped: tuple[str, ...],
                temp: tuple[str, ...], since: float) -> dict[str, str]:
    """What a rank's environment gets so that every process in it, Python or not, loads the library: the
    places whose reads are no input and when the call began (the Python observer's own)."""
    before = environ.get("LD_PRELOAD", "")
    return {"LD_PRELOAD": library_path + (" " + before if before else ""),
            settings.OBSERVE_SKIP.name: "\n".join(skipped), settings.OBSERVE_TEMP.name: "\n".join(temp),
            settings.OBSERVE_SINCE.name: repr(since)}


def without_observer(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for a program parsl-torch starts for itself (a ``git`` look): no observer in it, so what
    it reads is not the stage's."""
    env = {k: v for k, v in environ.items() if k != settings.READS_DIR.name}
    kept = [lib for lib in environ.get("LD_PRELOAD", "").split() if MARK not in lib]
    env.pop("LD_PRELOAD", None)
    return {**env, "LD_PRELOAD": " ".join(kept)} if kept else env


def python_program(word: str) -> bool:
    """Whether a command's first word is a Python interpreter (``python``, ``python3.11``, a venv's), which
    the Python observer observes without this library."""
    return os.path.basename(word).startswith("python")


def unobservable(program: str) -> str | None:
    """Why what ``program`` reads cannot be seen by the library, as the library says it of the programs a
    rank starts (a static binary, a Go program outside the installed packages, set-user-ID), or None."""
    try:
        st = os.stat(program)
        with open(program, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:  # (a script: its interpreter is what runs)
                return None
            if not any(kind == 3 for kind, _ in _headers(f, head, 32, 54)):  # PT_INTERP: it loads the library
                return f"a static program, which does not load the observer: {program}"
            if _go(f, head) and not program.startswith(skipped_places()):  # (an installed package's: its own)
                return f"a Go program, which reads through its own system calls, unseen: {program}"
    except OSError:
        return None
    if st.st_mode & 0o6000:
        return f"a set-user-ID program, which does not load the observer: {program}"
    return None


def _headers(f: Any, head: bytes, at: int, sizes: int) -> list[tuple[int, bytes]]:
    """An ELF file's program (``at`` 32) or section (40) headers: (the first 4 bytes' number, the header)."""
    offset = int.from_bytes(head[at:at + 8], "little")
    size, count = int.from_bytes(head[sizes:sizes + 2], "little"), int.from_bytes(head[sizes + 2:sizes + 4], "little")
    found = []
    for i in range(min(count, 256)):
        f.seek(offset + i * size)
        header = f.read(size)
        found.append((int.from_bytes(header[:4], "little"), header))
    return found


def _go(f: Any, head: bytes) -> bool:
    """Whether an ELF file is a Go program: a ``.go.buildinfo`` section."""
    sections = _headers(f, head, 40, 58)
    index = int.from_bytes(head[62:64], "little")
    if not sections or index >= len(sections):
        return False
    names_at = int.from_bytes(sections[index][1][24:32], "little")  # (the names' section: its sh_offset)
    for name_at, _ in sections:
        f.seek(names_at + name_at)
        if f.read(14) == b".go.buildinfo\0":
            return True
    return False


