"""What a finished stage read, as its ranks' Python processes saw it (``observe.recorder``), kept with
its call: a skip needs every such read unchanged, besides an equal identity.

A call's record holds one digest per read, taken when the stage finished (so a stage that
rewrites what it read is compared with what it left): ``read <path>`` a file (its digest: a stat
key with ctime, then SHA-256; a ``.py`` file's syntax tree, as a module's: a comment changes
nothing), ``read folder <path>`` a folder of many files read (every file in it, by its stat),
``listed <path>`` a folder's names, ``stat <path>`` what was looked at of a path's metadata (its kind, its
size, and its time where its content is not read too: ``[ -s f ]``, ``ls -l``, ``os.path.getsize``; a folder
by its kind, a link by its target too), ``kind <path>`` only its kind (``os.path.exists`` that found it),
``env <NAME>`` a variable as the ranks get it. Reads in the
stage's own directory and the run's own files (its records, Parsl's folder, a stage's dot-files)
are not inputs; another stage's output read by its path is. A file that changed while the
stage ran, after it read it (and not by the stage's own hand), is ``during <path>``: such a result
was made from a content that is no longer there, so it makes no skip promise.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Container, Mapping
from pathlib import Path

from ...common import stagedir
from ...observe.recorder import file_state, session_variable
from ...core.log import get_logger
from .digests import DigestCache, sha
from .environment import env_components

def recorded(stage_dir: str | os.PathLike) -> stagedir.ReadsRecord | None:
    """The reads its supervisor (or its warm ranks) recorded (None: not observed: a record of a version
    that did not observe)."""
    return stagedir.read_or_none(Path(stage_dir) / stagedir.READS, stagedir.ReadsRecord,
                                 get_logger("parsl_torch.workflow"))


def read_digests(record: stagedir.ReadsRecord, stage_dir: str, stage_env: Mapping[str, str],
                 cache: DigestCache, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each observed read's digest now (at the stage's end, and again at each skip check)."""
    ours = RunFiles(stage_dir)
    digests: dict[str, str] = {f"{DURING}{path}": "changed" for path in changed_while_running(record.reads, ours)}
    read = {line[2:] for line in record.reads if line.startswith("f ")}
    names: set[str] = set()
    for line in record.reads:
        kind, _, what = line.partition(" ")
        if kind == "e":
            names.update(_whole_environment(stage_env, environ) if what == "*" else [what])
        elif kind in _KEYS and not ours(what):  # (recorded absolute; a stat each)
            digests[_KEYS[kind] + what] = _digest(_KEYS[kind] + what, cache, read)
    if any(line == "e *" for line in record.reads):  # (dict(os.environ) reads each name too: not told apart)
        names = {n for n in names if not session_variable(n)}
        digests["env *"] = _names_digest(stage_env, environ)
    digests.update(env_components(sorted(names), stage_env, environ))
    return digests


#: a read whose file changed while the stage ran: never equal to anything now
DURING = "during "


class RunFiles:
    """Whether a path read is the run's own rather than an input: in the stage's own directory, the run
    directory's files and folders of its own (``status.json``, Parsl's ``parsl/``, dot-files), a stage's
    records and earlier calls (``<stage>/.call.json``, ``<stage>/.previous/``). Another stage's output
    (``<run>/producer/out.txt``, opened by a path string) is an input: it changes when its producer reruns."""

    def __init__(self, stage_dir: str) -> None:
        run_dir = os.path.dirname(os.path.abspath(stage_dir))
        self.runs = tuple({os.path.join(p, "") for p in (run_dir, os.path.realpath(run_dir))})
        self.stage = os.path.basename(os.path.abspath(stage_dir))

    def _inside(self, path: str) -> list[str] | None:
        inside = next((path[len(r):] for r in self.runs if os.path.join(path, "").startswith(r)), None)
        return None if inside is None else inside.rstrip(os.sep).split(os.sep)

    def producer(self, path: str) -> str | None:
        """The other stage whose folder holds ``path`` (None: not another stage's output)."""
        parts = self._inside(path)
        return parts[0] if parts is not None and len(parts) > 1 and not self(path) else None

    def __call__(self, path: str) -> bool:
        parts = self._inside(path)
        if parts is None:
            return False
        if len(parts) == 1:  # the run directory, its own files; another stage's folder listed is an input
            return not parts[0] or parts[0] in (self.stage, "parsl") or parts[0].startswith(".") or \
                not os.path.isdir(path)
        return parts[0] in (self.stage, "parsl") or any(p.startswith(".") for p in parts)


def changed_while_running(lines: list[str], ours: Callable[[str], bool] = lambda path: False) -> list[str]:
    """The files read whose state at their first read (``t`` lines) is not their state now, or was not the
    same for every process that read them, except those the stage wrote itself (``w``) and ``ours``."""
    states: dict[str, set[str]] = {}
    written = {line[2:] for line in lines if line.startswith("w ")}
    folders = {line[2:] for line in lines if line.startswith("W ")}
    for line in lines:
        if line.startswith("t "):
            _, state, path = line.split(" ", 2)
            states.setdefault(path, set()).add(state)
    return sorted(path for path, seen in states.items() if path not in written and
                  os.path.dirname(path) not in folders and
                  not ours(path) and (len(seen) > 1 or file_state(path) not in seen))


def _names_digest(stage_env: Mapping[str, str], environ: Mapping[str, str] | None) -> str:
    """Which variables there are (a stage that read them all sees one more, or one fewer)."""
    return sha(json.dumps(sorted(_whole_environment(stage_env, environ))).encode())


#: a recorded read's kind (``observe.recorder``) -> its key in a call's record, before its path
_KEYS = {"f": "read ", "F": "read folder ", "d": "listed ", "m": "stat ", "k": "kind "}


def _digest(key: str, cache: DigestCache, read: Container[str] = ()) -> str:
    """The digest now of the read a record's key names (``read``: the files whose content is read too)."""
    if key.startswith(("stat ", "kind ")):
        kind, _, path = key.partition(" ")
        return _metadata(path, "kind" if kind == "kind" else "time" if path not in read else "size")
    if key.startswith("listed "):
        try:
            return sha(json.dumps(sorted(os.listdir(key[len("listed "):]))).encode())
        except OSError:
            return "missing"
    if key.startswith("read folder "):  # each file in it by its stat, no hashing (a dataset's shards: too large)
        folder = key[len("read folder "):]
        return cache.file_digest(folder) if os.path.isdir(folder) else "missing"
    path = key[len("read "):]
    if path.endswith(".py") and os.path.isfile(path):  # code: by its syntax tree, as a module's
        return cache.module(path).digest
    return cache.file_digest(path) if not os.path.isdir(path) else "folder"


def _metadata(path: str, detail: str) -> str:
    """What a look at a path's metadata saw: its kind, a link's target, and to ``detail`` ("kind", "size",
    "time": where its content is not compared) a file's size and modification time."""
    link = ""
    try:
        if os.path.islink(path):
            link = f"link {os.readlink(path)}: "
        st = os.stat(path)
    except OSError:
        return f"{link}missing"
    if stat.S_ISDIR(st.st_mode):
        return f"{link}folder"
    return f"{link}file" + ("" if detail == "kind" else f" {st.st_size}") + (f" {st.st_mtime_ns}" if detail == "time" else "")


def _whole_environment(stage_env: Mapping[str, str], environ: Mapping[str, str] | None) -> set[str]:
    environ = os.environ if environ is None else environ
    return {n for n in {*environ, *stage_env} if not session_variable(n)}


def current(before: Mapping[str, str], stage_dir: str, stage_env: Mapping[str, str], cache: DigestCache,
            environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The digests of the same reads now (the names and paths a finished call's record lists)."""
    names = [key[len("env "):] for key in before if key.startswith("env ") and key != "env *"]
    read = {key[len("read "):] for key in before if key.startswith("read ")}
    now = {key: _digest(key, cache, read) for key in before if key.startswith(tuple(_KEYS.values()))}
    if "env *" in before:
        now["env *"] = _names_digest(stage_env, environ)
    return {**now, **env_components(names, stage_env, environ)}


def undeclared_outputs(reads: Mapping[str, str], stage_dir: str, parts: Mapping[str, str]) -> None:
    """Warn of each file of another stage's that the call read by its path without being given it (an
    ``inputs=`` File, a File argument): it is compared as any read, but which run of that stage it sees
    depends on an order the workflow does not say."""
    run, stage = RunFiles(stage_dir), os.path.basename(stage_dir)
    for path in sorted(k[len("read "):] for k in reads if k.startswith("read ") and f"input {k[5:]}" not in parts):
        if (producer := run.producer(path)) is not None:
            get_logger("parsl_torch.workflow").warning(
                "[%s] read %s, an output of stage %r, by its path: declare the dependency (pass %r's output "
                "File, future.outputs[i], in inputs=) so that it always runs after that stage", stage, path,
                producer, producer)


def reads_of_call(stage_dir: str, stage_env: Mapping[str, str], cache: DigestCache) -> dict[str, str] | None:
    """For a finished call's record: its reads' digests now (None: not observed, or not by every rank)."""
    record = recorded(stage_dir)
    if record is None:
        return None
    log, stage = get_logger("parsl_torch.workflow"), os.path.basename(stage_dir)
    if record.ranks < record.expected:
        log.warning("[%s] %d of its %d ranks told what they read (a rank's Python could not observe, or its shim "
                    "could not reach the supervisor): the next run runs it again", stage, record.ranks, record.expected)
        return None
    unseen = sorted(line[2:] for line in record.reads if line.startswith("x "))
    if unseen:
        log.warning("[%s] not all it read was seen (%s): the next run runs it again", stage, "; ".join(unseen[:3]))
        return None
    digests = read_digests(record, stage_dir, stage_env, cache)
    for key in (k for k in digests if k.startswith(DURING)):
        log.warning("[%s] input %s changed while it ran, after it read it (its result may be of the content "
                    "before): the next run runs it again", stage, key[len(DURING):])
    return digests
