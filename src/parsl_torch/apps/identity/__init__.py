"""What a stage call is, so that a rerun skips it only when nothing it depends on changed.

The identity sub-package: ``stage_components`` (a ``StageCall`` and its arguments -> its
components) is its entry point, and ``call_id`` makes the memo key of them; ``fingerprint``
reads a function, ``usercode`` the user modules code reaches, ``memo`` is Parsl's memoizer
with these rules. A call's components, each a digest:

* ``code``: the function (``fingerprint``: its code and the values of the
  globals it uses, without positions), or the script's syntax tree;
* ``module <file>``: every user module that code can import (``usercode``);
* ``package <name>``: every installed package that code imports, by its version
  and files (``packages``);
* ``runtime``: parsl-torch's version and sources, and torch's version;
* ``options``: nodes, ranks per node, environment (the site's too), launcher flags, stage directory;
* ``site setup``: the site's ``provider.worker_init`` (the modules the ranks load);
* ``env <NAME>``: each variable the stage is given (its ``env=``, the site's ``environment``);
* ``arguments``: the call's own arguments and output names (``fingerprint``);
* ``input <path>``: the content of each file the stage is told about:
  ``inputs=``, ``Path``/File arguments and globals, a built-in stage's data files.

That is what is known before the stage runs. Everything else it depends on (the files it opens,
however their names were made, the folders it lists, the variables it reads, the modules it
imports by a computed name) is what its ranks were seen to read, kept with the finished call and
compared at the next run (``reads``): a skip needs both unchanged.
Not compared: ``walltime`` and ``retries`` (they cannot change a result).
A file is hashed (SHA-256) when its size, mtime or inode differ from the last
time; ``PARSL_TORCH_INPUT_HASH=stat`` uses those alone (for huge inputs), and
a directory is always compared by the size and mtime of its files (not those
under hidden folders or ``__pycache__``, nor the run directory's own). Digests
(and parsed modules) are cached in ``<run_dir>/parsl/input-digests.json``,
which the workflow and its workers share.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...common import stagedir
from ...core.log import get_logger
from ...errors import ConfigError
from ..stage.call import StageCall
from ..stage.scriptargs import runs_python, script_command_length
from . import usercode
from .environment import env_components
from .digests import DIGESTS, DigestCache, file_digest, sha  # noqa: F401 - (the sub-package's API)
from .fingerprint import Fingerprinter, Unidentifiable
from .reads import reads_of_call, undeclared_outputs
from .outputs import output_digests
from .packages import package_components

#: keyword arguments of a stage's app that are Parsl's, not the call's own
PARSL_KWARGS = ("inputs", "outputs", "stdout", "stderr", "parsl_resource_specification")
#: the code components' list of the installed modules it imports (``package <name>``), resolved where the
#: stage runs (a remote stage's on its endpoint)
PACKAGES = "imports packages"
@dataclasses.dataclass(frozen=True)
class Arguments:
    """A call's arguments as its identity sees them: their digest, the files they name (with their
    digests) and the user modules of the functions and classes among them (``(file, module)``)."""

    digest: str
    files: dict[str, str]
    roots: tuple[tuple[str, str], ...]
    packages: tuple[str, ...] = ()


def arguments_digest(command: Sequence[str], args: Sequence[Any], kwargs: Mapping[str, Any],
                     outputs: Sequence[Any], cache: DigestCache) -> Arguments:
    """The call's own arguments (strict: a value with no stable identity is ``Unidentifiable``), a
    script's Python and script (``command``: the code, not inputs) and the names of its outputs (named,
    not read)."""
    fp = Fingerprinter(strict=True)
    tokens: list[Any] = [("command", [str(c) for c in command])]
    tokens += [fp.token(v, f"argument {i + 1}") for i, v in enumerate(args)]
    tokens += [(k, fp.token(kwargs[k], f"argument {k!r}")) for k in sorted(kwargs)]
    tokens.append(("outputs", [str(getattr(o, "url", o)) for o in outputs]))
    return Arguments(sha(repr(tokens).encode()), {path: cache.file_digest(path) for path in sorted(fp.files)},
                     tuple(sorted(fp.roots)), tuple(sorted(fp.packages)))


def search_path(opts: Any) -> list[str]:
    """Where the ranks import from (``StageOptions.rank_path``), a relative folder of a ``PYTHONPATH`` given
    with ``env=`` as the ranks see it: in the stage's directory, where they start."""
    return [os.path.join(opts.stage_dir, p) for p in opts.rank_path]


def code_components(opts: Any, cache: DigestCache, arguments: Arguments | None = None) -> dict[str, str]:
    """``code`` and ``module <file>``: what the stage runs (read where its code is), and the list
    resolved where it runs (``PACKAGES``); ``arguments``: their functions and classes reach more code."""
    parts = {"code": opts.code, **{f"state {name}": digest for name, digest in opts.state}}
    roots = [*opts.code_roots, *(arguments.roots if arguments else ())]
    if opts.module:
        roots += usercode.module_origin(opts.module, search_path(opts))
    program = bool(opts.script) and not runs_python(opts.script)  # (a shell script, a binary: its bytes)
    if opts.script and not program:
        roots.append((opts.script, "__main__"))
    reached = usercode.user_modules(roots, search_path(opts), cache)
    modules = reached.digests
    if program:
        parts["code"] = cache.file_digest(opts.script) if os.path.isfile(opts.script) else "missing"
    elif opts.script:  # a script stage's own code is its script
        parts["code"] = modules.pop(os.path.realpath(opts.script), "missing")
    parts.update((f"module {path}", digest) for path, digest in modules.items())
    more = arguments.packages if arguments else ()
    parts[PACKAGES] = json.dumps(sorted({*reached.packages, *opts.packages, *more}))
    return parts


def argument_modules(arguments: Arguments, import_path: Sequence[str], cache: DigestCache) -> dict[str, str]:
    """``module <file>`` for the code of the arguments' functions and classes, and the installed modules it
    imports (read where the arguments are: a remote stage's code components were read elsewhere)."""
    reached = usercode.user_modules(arguments.roots, import_path, cache)
    return {**{f"module {path}": digest for path, digest in reached.digests.items()},
            PACKAGES: json.dumps(sorted({*reached.packages, *arguments.packages}))}


def _inputs(given: Mapping[str, str | None], stage_dir: str, cache: DigestCache) -> dict[str, str]:
    """``input <path>`` for each file given (with its digest, or None: read now), but the stage's own
    (its outputs)."""
    inside = os.path.join(stage_dir, "")
    return {f"input {path}": digest if digest is not None else cache.file_digest(path)
            for path, digest in given.items() if not os.path.abspath(path).startswith(inside)}


def data_components(opts: Any, arguments: Arguments, inputs: Sequence[Any], cache: DigestCache) -> dict[str, str]:
    """``options``, ``arguments`` and ``input <path>``: what the stage is given (read where its files are)."""
    options = json.dumps([opts.stage_dir, opts.num_nodes, opts.ranks_per_node, list(map(list, opts.env)),
                          list(opts.launcher_args)])
    given = {**{path: None for path in opts.files}, **{i.filepath: None for i in inputs if hasattr(i, "filepath")},
             **arguments.files}
    setup = {"site setup": sha(opts.site_setup.encode())} if opts.site_setup else {}
    if opts.accelerated:  # (absent on CPUs: the identities of CPU runs made before it stay as they were)
        setup["accelerators"] = "yes"
    return {"options": sha(options.encode()), **setup, "arguments": arguments.digest,
            **_inputs(given, opts.stage_dir, cache)}


@functools.lru_cache(maxsize=1)
def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for dist in ("parsl-torch", "torch"):
        try:
            found.append(f"{dist}=={version(dist)}")
        except PackageNotFoundError:
            found.append(f"{dist} (no metadata)")
    return " ".join(found)


def runtime_digest(cache: DigestCache) -> str:
    """parsl-torch's version and the content of its sources (an edited editable install, an upgrade), and
    torch's version: what runs every stage besides the user's code."""
    package = Path(usercode.PACKAGE_DIR)
    sources = [(str(p.relative_to(package)), cache.file_digest(p)) for p in sorted(package.rglob("*.py"))]
    return sha(json.dumps([_versions(), sources]).encode())


def call_id(parts: Mapping[str, str]) -> str:
    return sha(json.dumps(dict(parts), sort_keys=True).encode())


def read_call(stage_dir: str | os.PathLike) -> stagedir.CallRecord | None:
    """The record of the call whose files are in ``stage_dir`` (None: none finished, or a run started
    since; a damaged record is None too, with a warning: the stage runs again)."""
    return stagedir.read_or_none(Path(stage_dir) / stagedir.CALL, stagedir.CallRecord, get_logger("parsl_torch.workflow"))


def write_call(stage_dir: str | os.PathLike, memo_key: str, parts: Mapping[str, str], outputs: Sequence[Any],
               cache: DigestCache, stage_env: Mapping[str, str]) -> None:
    """The call finished: its identity, its outputs' digests and what it read, as it left them (a skip
    stands while they are unchanged). ``stage_env``: its ``env=``, as its ranks got it."""
    reads = reads_of_call(str(stage_dir), stage_env, cache)
    if reads is not None:
        undeclared_outputs(reads, str(stage_dir), parts)
    stagedir.write(Path(stage_dir) / stagedir.CALL,
                   stagedir.CallRecord(memo_key, dict(parts), output_digests(outputs, cache), reads))
    cache.save()


def forget_call(stage_dir: str | os.PathLike) -> None:
    """A run of the stage starts: its directory no longer holds the last finished call's files. What a
    finished call read goes too (its record holds it); what an unfinished attempt read stays, for the
    attempts that resume it (a retry, a continuation, a rerun after a kill) read on from it."""
    if (Path(stage_dir) / stagedir.CALL).exists():
        stagedir.forget(Path(stage_dir) / stagedir.READS)
    stagedir.forget(Path(stage_dir) / stagedir.CALL)


def stage_components(call: StageCall, args: tuple, kwargs: dict[str, Any], cache: DigestCache,
                     code: Mapping[str, str] | None = None) -> dict[str, str]:
    """The identity of a stage call from its app's arguments (futures resolved); a script stage's
    command line counts among its arguments. ``code``: its code components when they were read
    elsewhere (a remote stage's, where the workflow runs)."""
    opts = call.opts
    own = {k: v for k, v in kwargs.items() if k not in PARSL_KWARGS}
    script = list(call.script)
    command = script_command_length(script)  # Python and the script: code, not inputs
    try:
        arguments = arguments_digest(script[:command], (*script[command:], *args), own,
                                     list(kwargs.get("outputs", ())), cache)
    except Unidentifiable as exc:
        raise ConfigError(f"stage {call.stage!r}: {exc}") from None
    code_parts = dict(code_components(opts, cache, arguments) if code is None else code)
    packages = set(json.loads(code_parts.pop(PACKAGES, "[]")))
    if code is not None:  # (a remote stage's, read where the workflow runs: its arguments' modules are read here)
        more = argument_modules(arguments, search_path(opts), cache)
        packages.update(json.loads(more.pop(PACKAGES)))
        code_parts.update(more)
    parts = {**code_parts, **package_components(packages), "runtime": runtime_digest(cache),
             **env_components(sorted(opts.environment), opts.environment),
             **data_components(opts, arguments, list(kwargs.get("inputs", ())), cache)}
    cache.save()  # once per call: what was hashed, for the next call and the next run
    return parts
