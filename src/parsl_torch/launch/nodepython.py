"""Python from node-local storage (site ``node_local_python: DIR``).

At scale ``import torch`` from a shared file system is the start-up: every rank reads
thousands of small files from the same servers (ALCF and OLCF publish 50-120 s at 8-2048
nodes, against 2 s from node-local NVMe). Here the Python environment (the interpreter, its
standard library and the venv's packages) is packed into one archive on the shared file
system, once per environment change (``~/.cache/parsl-torch/python-<digest>.tar``), and at
the start of each block unpacked into DIR on every node of the block (Slurm: ``sbcast``
copies the archive first; elsewhere each node reads the one archive). The stages' ranks then
start from that copy (``settings.NODE_PYTHON``, set in the block's environment).

``eval "$(python -m parsl_torch.launch.nodepython stage DIR)"`` (the block's worker_init) exports
the Python the ranks start; when anything fails it exports why instead (each stage's supervisor says
it in the stage's stderr.txt) and the ranks start from the shared environment, as without the setting.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import site
import subprocess
import sys
import tarfile
from pathlib import Path

from ..common import settings
from ..common.entrypoints import NODE_PYTHON
from .schedulers import detect_scheduler, get_scheduler

#: parts of the standard library no stage imports (kept out of the archive)
SKIP_STDLIB = frozenset({"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"})
#: what ``stage`` unpacks into, under the site's directory
UNPACKED = "parsl-torch-python"


def env_digest() -> str:
    """Changes when the environment does: its paths, Python's version, what is installed."""
    parts = [sys.version, sys.prefix, sys.base_prefix]
    for packages in site.getsitepackages([sys.prefix]):
        with_entries = sorted(os.listdir(packages)) if os.path.isdir(packages) else []
        parts += [packages, str(os.stat(packages).st_mtime_ns) if with_entries else "", *with_entries]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _version_dir() -> str:
    return f"python{sys.version_info.major}.{sys.version_info.minor}"


def _base_filter(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = Path(info.name).parts  # base/lib/pythonX.Y/<part>/...
    if len(parts) > 3 and parts[1] == "lib" and parts[2] == _version_dir() and (
            parts[3] in SKIP_STDLIB or parts[3].startswith("config-")):
        return None
    return info


def pack(cache: Path) -> Path:
    """The environment's archive in ``cache``, made if this environment has none yet."""
    archive = cache / f"python-{env_digest()}.tar"
    if archive.exists():
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    base = Path(sys.base_prefix)
    stripe_wide(tmp)
    with tarfile.open(tmp, "w") as tar:
        tar.add(base / "bin" / _interpreter(), "base/bin/" + _interpreter())
        for lib in (base / "lib").glob("libpython*"):
            tar.add(lib, f"base/lib/{lib.name}")
        tar.add(base / "lib" / _version_dir(), f"base/lib/{_version_dir()}", filter=_base_filter)
        if Path(sys.prefix) != base:
            tar.add(sys.prefix, "venv")
    os.replace(tmp, archive)
    return archive


def stripe_wide(path: Path) -> None:
    """On Lustre, ``path`` created striped over every OST: every node of a block reads the one archive at
    once, and a file on one OST (the default) would serve them all at one OST's bandwidth, a few GB/s
    (Flare: 650 GB/s over 160 OSTs). Elsewhere (no ``lfs``, or not Lustre) nothing happens."""
    if lfs := shutil.which("lfs"):
        subprocess.run([lfs, "setstripe", "-c", "-1", str(path)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)


def _interpreter() -> str:
    return Path(os.path.realpath(sys._base_executable)).name


def unpack(archive: Path, dest: Path) -> Path:
    """``archive`` unpacked under ``dest`` (once per node: a second block finds it there); returns its Python."""
    root = dest / UNPACKED / archive.stem
    if not (root / ".complete").exists():
        _unpack_into(archive, root)
    return root / ("venv" if (root / "venv").is_dir() else "base") / "bin" / "python"


def _unpack_into(archive: Path, root: Path) -> None:
    tmp = root.with_name(f"{root.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _extract(archive, tmp)
    _relocate(tmp, root)
    (tmp / ".complete").touch()
    try:
        os.rename(tmp, root)
    except OSError:  # another process of this node unpacked it first
        shutil.rmtree(tmp, ignore_errors=True)


def _extract(archive: Path, into: Path) -> None:
    """The archive's files under ``into``: with the node's ``tar`` where there is one (GNU tar unpacks a
    1.8 GB environment with a 30th of the CPU of Python's ``tarfile``, on every node of every block: 0.3 s
    against 10 s, docs/sites/index.md), failing on a ``..`` name, stripping a leading ``/`` and setting no
    permission its umask masks, as ``tarfile``'s ``tar`` filter does where there is none."""
    if shutil.which("tar"):
        subprocess.run(["tar", "-xf", str(archive), "-C", str(into), "--no-same-permissions"], check=True,
                       stdout=subprocess.DEVNULL)
        return
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="tar")


def _relocate(tmp: Path, root: Path) -> None:
    """The copied venv points at the copied interpreter (its ``pyvenv.cfg`` and ``bin/python``)."""
    base_python = root / "base" / "bin" / _interpreter()
    (tmp / "base" / "bin" / "python").symlink_to(_interpreter())
    venv = tmp / "venv"
    if not venv.is_dir():
        return
    cfg = venv / "pyvenv.cfg"
    lines = [f"home = {root / 'base' / 'bin'}" if line.startswith("home") else
             f"executable = {base_python}" if line.startswith("executable") else line
             for line in cfg.read_text().splitlines()]
    cfg.write_text("\n".join(lines) + "\n")
    for name in ("python", "python3", _interpreter()):
        (venv / "bin" / name).unlink(missing_ok=True)
    (venv / "bin" / _interpreter()).symlink_to(base_python)
    for name in ("python", "python3"):
        if not (venv / "bin" / name).exists() and name != _interpreter():
            (venv / "bin" / name).symlink_to(_interpreter())


def stage(dest: Path, cache: Path) -> Path:
    """Pack (if needed), put the archive on every node of this job, unpack it there; the Python to start."""
    archive = pack(cache)
    found = detect_scheduler()
    nodes = get_scheduler(found.scheduler).job_nodes(os.environ) if found.in_job else ()
    source = _broadcast(archive, dest) if found.scheduler == "slurm" and len(nodes) > 1 else archive
    if len(nodes) > 1:
        subprocess.run([sys.executable, "-m", "parsl_torch.cli", "launch", "--ppn", "1", "-n", str(len(nodes)),
                        "--timeout", "1800", "--", sys.executable, "-m", NODE_PYTHON, "unpack", str(source),
                        str(dest)], check=True, stdout=subprocess.DEVNULL)
    python = unpack(source, dest)
    if source != archive:
        source.unlink(missing_ok=True)
    return python


def _broadcast(archive: Path, dest: Path) -> Path:
    """The archive copied to every node's ``dest`` by ``sbcast`` (one read of the shared file system, fanned
    out by Slurm); where that fails, the shared archive itself, which each node then reads (said on stderr)."""
    if not shutil.which("sbcast"):
        return archive
    copy = dest / archive.name
    done = subprocess.run(["sbcast", "--force", str(archive), str(copy)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False)
    if done.returncode == 0:
        return copy
    print(f"parsl-torch: node_local_python: sbcast failed ({done.stderr.strip() or f'exit {done.returncode}'}); "
          f"each node reads the archive from {archive.parent} instead", file=sys.stderr)
    return archive


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 3 and argv[0] == "unpack":
        archive, dest = Path(argv[1]), Path(argv[2])
        unpack(archive, dest)
        # sbcast's copy on this node's storage, unpacked (or the part of one that a failed sbcast left): it goes
        (dest / archive.name).unlink(missing_ok=True)
        return 0
    if len(argv) != 2 or argv[0] != "stage":
        print(f'usage: eval "$(python -m {NODE_PYTHON} stage DIR)"   (a block\'s worker_init, set by the site\'s '
              f"node_local_python)", file=sys.stderr)
        return 2
    cache = Path(settings.CACHE_DIR.get()).expanduser()
    try:
        python = stage(Path(argv[1]), cache)
    except (OSError, subprocess.CalledProcessError, tarfile.TarError) as exc:
        why = f"could not stage the Python environment to {argv[1]} ({exc}): the ranks start from the shared one"
        print(f"parsl-torch: node_local_python: {why}", file=sys.stderr)
        print(f"export {settings.NODE_PYTHON_UNSTAGED.name}={shlex.quote(why)}")
        return 0
    print(f"export {settings.NODE_PYTHON.name}={shlex.quote(str(python))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
