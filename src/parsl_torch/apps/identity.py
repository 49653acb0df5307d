"""What a stage call is, so that a rerun skips it only when nothing it depends on changed.

A call's components, each a digest:

* ``code``: the function (``fingerprint``: its code and the values of the
  globals it uses, without positions), or the script's syntax tree;
* ``module <file>``: every user module that code can import (``usercode``);
* ``options``: nodes, ranks per node, environment, launcher flags, stage directory;
* ``arguments``: the call's own arguments and output names (``fingerprint``);
* ``input <path>``: the content of each file the stage is told about:
  ``inputs=``, ``Path``/File arguments, files named in a script's ``args``,
  files named in a built-in stage's config.

Not compared: ``walltime`` and ``retries`` (they cannot change a result).
A file is hashed (SHA-256) when its size, mtime or inode differ from the last
time; ``PARSL_TORCH_INPUT_HASH=stat`` uses those alone (for huge inputs), and
a directory is always compared by the size and mtime of its files. Digests
(and parsed modules) are cached in ``<run_dir>/parsl/input-digests.json``,
which the workflow and its workers share.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..common import settings, stagedir
from ..common.files import write_atomic
from ..core.log import get_logger
from . import usercode
from .fingerprint import Fingerprinter

#: in a stage directory: the call whose files are there (written when it succeeds)
DIGESTS = "input-digests.json"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _stat_key(st: os.stat_result) -> str:
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


class DigestCache:
    """File digests and parsed modules of one run directory, remembered by size, mtime and inode.

    Read once, written once per ``save`` (merged with what another process wrote meanwhile)."""

    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = Path(path) if path is not None else None
        self._known: dict[str, Any] | None = None
        self._dirty: dict[str, Any] = {}
        self._lock = threading.RLock()

    @classmethod
    def of_run_dir(cls, run_dir: str | os.PathLike) -> DigestCache:
        return cls(Path(run_dir) / "parsl" / DIGESTS)

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
        "missing" if it does not exist."""
        path = os.path.abspath(path)
        try:
            st = os.stat(path)
        except OSError:
            return "missing"
        if os.path.isdir(path):
            entries = sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns)
                             for p in Path(path).rglob("*") if p.is_file())
            return "dir:" + _sha(json.dumps(entries).encode())
        key = _stat_key(st)
        if settings.INPUT_HASH.get() == "stat":
            return f"stat:{key}"
        entry = self._entry(path, key)
        if entry is not None:
            return entry["sha256"]
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        self._remember(path, {"stat": key, "sha256": h.hexdigest()})
        return h.hexdigest()

    def module(self, path: str) -> tuple[str, list[list[Any]]]:
        """(digest of the module's syntax tree, its imports): ``usercode.parse_module``, cached."""
        st = os.stat(path)
        entry = self._entry("py:" + path, _stat_key(st))
        if entry is not None:
            return entry["ast"], entry["imports"]
        digest, imports = usercode.parse_module(Path(path).read_bytes(), path)
        self._remember("py:" + path, {"stat": _stat_key(st), "ast": digest, "imports": imports})
        return digest, imports

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
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def file_digest(path: str | os.PathLike, cache: str | os.PathLike | None = None) -> str:
    """One file's digest, cached in the file ``cache`` (a DIGESTS file)."""
    digests = DigestCache(cache)
    try:
        return digests.file_digest(path)
    finally:
        digests.save()


def arguments_digest(args: Sequence[Any], kwargs: Mapping[str, Any], outputs: Sequence[Any],
                     cache: DigestCache) -> tuple[str, dict[str, str]]:
    """The call's own arguments (strict: a value with no stable identity is ``Unidentifiable``) and the
    names of its outputs (named, not read); and the files that Path and File arguments name, with
    their digests (inputs of the call)."""
    fp = Fingerprinter(cache.file_digest, strict=True)
    tokens = [fp.token(v, f"argument {i + 1}") for i, v in enumerate(args)]
    tokens += [(k, fp.token(kwargs[k], f"argument {k!r}")) for k in sorted(kwargs)]
    tokens.append(("outputs", [str(getattr(o, "url", o)) for o in outputs]))
    return _sha(repr(tokens).encode()), fp.files


def code_components(opts: Any, cache: DigestCache) -> dict[str, str]:
    """``code`` and ``module <file>``: what the stage runs (read where its code is)."""
    parts = {"code": opts.code}
    roots = list(opts.code_roots)
    if opts.module:
        roots += usercode.module_origin(opts.module, opts.import_path)
    if opts.script:
        roots.append((opts.script, "__main__"))
    modules = usercode.user_modules(roots, opts.import_path, cache)
    if opts.script:  # a script stage's own code is its script
        parts["code"] = modules.pop(os.path.realpath(opts.script), "missing")
    parts.update((f"module {path}", digest) for path, digest in modules.items())
    cache.save()
    return parts


def data_components(opts: Any, arguments: tuple[str, dict[str, str]], inputs: Sequence[Any],
                    cache: DigestCache) -> dict[str, str]:
    """``options``, ``arguments`` and ``input <path>``: what the stage is given (read where its files are)."""
    options = json.dumps([opts.stage_dir, opts.num_nodes, opts.ranks_per_node, list(map(list, opts.env)),
                          list(opts.launcher_args)])
    parts = {"options": _sha(options.encode()), "arguments": arguments[0]}
    stage_dir = os.path.join(opts.stage_dir, "")
    for path in [*opts.files, *(getattr(i, "filepath", None) for i in inputs)]:
        if path is not None and not os.path.abspath(path).startswith(stage_dir):  # its own files are outputs
            parts[f"input {path}"] = cache.file_digest(path)
    parts.update((f"input {path}", digest) for path, digest in arguments[1].items())
    cache.save()
    return parts


def call_id(parts: Mapping[str, str]) -> str:
    return _sha(json.dumps(dict(parts), sort_keys=True).encode())


def read_call(stage_dir: str | os.PathLike) -> stagedir.CallRecord | None:
    """The record of the call whose files are in ``stage_dir`` (None: none finished, or a run started
    since; a damaged record is None too, with a warning: the stage runs again)."""
    return stagedir.read_or_none(Path(stage_dir) / stagedir.CALL, stagedir.CallRecord, get_logger("parsl_torch.workflow"))


def write_call(stage_dir: str | os.PathLike, memo_key: str, parts: Mapping[str, str]) -> None:
    stagedir.write(Path(stage_dir) / stagedir.CALL, stagedir.CallRecord(memo_key, dict(parts)))


def forget_call(stage_dir: str | os.PathLike) -> None:
    """A run of the stage starts: its directory no longer holds the last finished call's files."""
    stagedir.forget(Path(stage_dir) / stagedir.CALL)


def why_rerun(stage: str, function: str, before: stagedir.CallRecord | None, now: Mapping[str, str],
              memo_hit: bool) -> str:
    """Why the stage runs (for the log), comparing the last finished call with this one."""
    if before is None:
        return "no finished run of it in this run directory" if not memo_hit else \
            f"its directory {stage}/ was rewritten by a run that did not finish"
    old = before.components
    changed = []
    if old.get("code") != now.get("code"):
        changed.append(f"code of `{function}` changed")
    for key in sorted(set(old) | set(now)):
        if key.startswith("module ") and old.get(key) != now.get(key):
            name = usercode.display_name(key[len("module "):])
            changed.append(f"{name} changed" if key in old and key in now else
                           f"{name} {'now imported' if key in now else 'no longer imported'}")
    if old.get("arguments") != now.get("arguments"):
        changed.append("arguments changed")
    if old.get("options") != now.get("options"):
        changed.append("stage options changed")
    for key in sorted(set(old) | set(now)):
        if key.startswith("input ") and old.get(key) != now.get(key):
            changed.append(f"{key} changed" if key in old and key in now else
                           f"{key} {'added' if key in now else 'removed'}")
    if not changed:
        return "its last result is not in Parsl's records" if not memo_hit else "unknown change"
    if memo_hit:
        return f"the files in {stage}/ are from another call of it ({', '.join(changed)})"
    return ", ".join(changed)
