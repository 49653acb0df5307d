"""What a stage call is, so that a rerun skips it only when nothing it depends on changed.

A call's components: its code (the shipped function's bytes, or the script's
content), its options (nodes, ranks, environment, launcher flags, stage
directory), its arguments, and the content of each input file. An input
file is hashed (SHA-256) when its size, mtime or inode differ from the last
time; ``PARSL_TORCH_INPUT_HASH=stat`` uses those alone (for huge inputs), and
a directory is always compared by the size and mtime of its files. Digests
are cached in ``<run_dir>/parsl/input-digests.json``, which the workflow and
its workers share.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..common.files import write_atomic

INPUT_HASH_VAR = "PARSL_TORCH_INPUT_HASH"
#: in a stage directory: the call whose files are there (written when it succeeds)
CALL_FILE = ".call.json"
DIGESTS = "input-digests.json"
_lock = threading.Lock()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_cache(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "parsl" / DIGESTS


def file_digest(path: str | os.PathLike, cache: Path | None = None) -> str:
    """The content digest of a file (stat-based for directories, or with PARSL_TORCH_INPUT_HASH=stat);
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
    key = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
    if os.environ.get(INPUT_HASH_VAR, "content") == "stat":
        return f"stat:{key}"
    with _lock:
        known = _read_cache(cache)
        if known.get(path, {}).get("stat") == key:
            return known[path]["sha256"]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    if cache is not None:
        with _lock:
            known = _read_cache(cache)
            known[path] = {"stat": key, "sha256": digest}
            _write_json(cache, known)
    return digest


def _read_cache(cache: Path | None) -> dict[str, Any]:
    if cache is None:
        return {}
    try:
        data = json.loads(cache.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def code_digest(blob: bytes | None, script: Sequence[str] | None) -> str:
    """A shipped function's bytes, or the content of the script (or ``-m`` module) a stage runs."""
    if blob is not None:
        return _sha(blob)
    words = [os.fspath(w) if isinstance(w, (str, os.PathLike)) else str(w) for w in script or ()]
    if "-m" in words[:2] and len(words) > words.index("-m") + 1:
        module = words[words.index("-m") + 1]
        with contextlib.suppress(ImportError, ValueError, AttributeError):
            spec = importlib.util.find_spec(module)
            if spec and spec.origin and os.path.isfile(spec.origin):
                return _sha(Path(spec.origin).read_bytes())
        return _sha(f"module {module}".encode())  # not importable here: by name
    target = next((w for w in words[1:2] if os.path.isfile(w)), None)
    return _sha(Path(target).read_bytes()) if target else _sha(" ".join(words).encode())


def components(opts: Any, arguments: bytes, inputs: Sequence[Any]) -> dict[str, str]:
    """The call's components, each a digest (see the module docstring). ``arguments``: the
    normalised positional and keyword arguments (Parsl's memo id)."""
    cache = digest_cache(Path(opts.stage_dir).parent)
    options = json.dumps([opts.stage_dir, opts.num_nodes, opts.ranks_per_node, opts.walltime,
                          list(map(list, opts.env)), list(opts.launcher_args)])
    parts = {"code": opts.code, "options": _sha(options.encode()), "arguments": _sha(arguments)}
    for item in inputs:
        path = getattr(item, "filepath", None)
        if path is not None:
            parts[f"input {path}"] = file_digest(path, cache)
    return parts


def call_id(parts: Mapping[str, str]) -> str:
    return _sha(json.dumps(dict(parts), sort_keys=True).encode())


def read_call(stage_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The record of the call whose files are in ``stage_dir`` (None: none finished, or a run started since)."""
    try:
        data = json.loads((Path(stage_dir) / CALL_FILE).read_text())
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def write_call(stage_dir: str | os.PathLike, memo_key: str, parts: Mapping[str, str]) -> None:
    _write_json(Path(stage_dir) / CALL_FILE, {"memo_key": memo_key, "components": dict(parts)})


def forget_call(stage_dir: str | os.PathLike) -> None:
    """A run of the stage starts: its directory no longer holds the last finished call's files."""
    with contextlib.suppress(FileNotFoundError):
        (Path(stage_dir) / CALL_FILE).unlink()


def why_rerun(stage: str, function: str, before: Mapping[str, Any] | None, now: Mapping[str, str],
              memo_hit: bool) -> str:
    """Why the stage runs (for the log), comparing the last finished call with this one."""
    if before is None:
        return "no finished run of it in this run directory" if not memo_hit else \
            f"its directory {stage}/ was rewritten by a run that did not finish"
    old = before.get("components", {})
    changed = []
    if old.get("code") != now.get("code"):
        changed.append(f"code of `{function}` changed")
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
