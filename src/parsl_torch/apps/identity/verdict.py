"""Whether a stage call skips: ``gate``, the one step of every route (the memoizer, ``memo``, where the
workflow runs; the task on a Globus Compute endpoint, ``remote.job``; the worker of your own Parsl config,
``stage.cold``), and every reason a stage reruns, worded.

It skips only when the cache holds a result of its identity, its directory's record (``.call.json``) is of
that identity, its outputs are as that call left them and what its ranks read is as it was. ``Facts`` reads
what the decision needs, lazily; ``decide`` is pure; ``prepare`` does what a verdict to run asks before the
attempt.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...common import stagedir
from ...common.stagedir import CallRecord
from ..stage.call import StageCall
from .freshdir import computation, is_new_call
from . import call_id, read_call, stage_components
from .digests import DigestCache
from .outputs import set_aside, spoiled_files
from .packages import package_change
from .reads import current
from .usercode import display_name


@dataclasses.dataclass(frozen=True)
class Verdict:
    """``why`` a call runs (None: it skips); its ``key`` and ``parts``, written with it when it finishes; the
    record of the call whose files are in its directory, and the outputs of it changed since; the
    ``computation`` it runs (``freshdir.computation``: its id, and why it is a new one of the same call)."""

    key: str
    parts: Mapping[str, str]
    before: CallRecord | None
    why: str | None = None
    changed: tuple[str, ...] = ()
    new_call: bool = False  # the directory holds another computation's files: they go to .previous/ when it runs
    again: bool = False  # a call of it finished before (its record, or the cache's result)
    computation: str = ""
    anew: str | None = None  # why the computation in its directory, of the same call, is not continued
    moved: tuple[str, ...] = ()  # the outputs set aside before its attempt (``prepare``)

    @property
    def skips(self) -> bool:
        return self.why is None

    def said(self, stage: str) -> list[str]:
        """What the log says of a call that runs: why, and that a new call's directory starts empty."""
        new = [f"a new call: the previous call's files go to {stage}/{stagedir.PREVIOUS}/"] if self.new_call else []
        if self.new_call and self.anew:
            new = [f"a new computation ({self.anew}): the previous one's files go to {stage}/{stagedir.PREVIOUS}/"]
        return [str(self.why), *new]


class Facts:
    """What the verdict on a call looks at, each read from its directory and the cache only when ``decide``
    asks for it (a skip reads the directory's record, its outputs and its reads; a run also who owns the
    directory). ``holds(key)``: whether the cache holds the result of the call whose memo key is ``key``;
    ``written_now``: the files that stages running now wrote in their last run (path -> stage)."""

    def __init__(self, call: StageCall, parts: Mapping[str, str], outputs: Sequence[Any], cache: DigestCache,
                 holds: Callable[[str], bool], written_now: Mapping[str, str] | None = None) -> None:
        self.call, self.parts, self.outputs, self.cache = call, parts, outputs, cache
        self._holds, self._written_now = holds, written_now or {}
        self.stage_dir, self.key = call.opts.stage_dir, call_id(parts)

    @functools.cached_property
    def before(self) -> CallRecord | None:
        return read_call(self.stage_dir)

    @functools.cached_property
    def cached(self) -> bool:
        return self._holds(self.key)

    @functools.cached_property
    def spoiled(self) -> tuple[list[str], list[str]]:
        return spoiled_files(self.stage_dir, self.call.returns, self.outputs, self.before, self.cache)

    @functools.cached_property
    def stale(self) -> list[str]:
        return stale_reads(self.before, self.stage_dir, self.call.opts.environment, self.cache) or \
            rewritten_now(self.before, self._written_now)

    @functools.cached_property
    def computation(self) -> tuple[str, str | None]:
        return computation(self.stage_dir, self.parts)

    @functools.cached_property
    def new_call(self) -> bool:
        return is_new_call(self.stage_dir, self.computation[0])

    @functools.cached_property
    def promoted(self) -> str | None:
        """Why a sweep let the paused computation in the directory go on (its ruling), or None."""
        ruling = stagedir.read_or_none(Path(self.stage_dir) / stagedir.RULING, stagedir.RulingRecord)
        ours = ruling is not None and ruling.call == self.computation[0]
        return ruling.why if ours and ruling.promoted else None


def decide(facts: Facts) -> Verdict:
    """The verdict on the call ``facts`` are of: it skips only when the cache holds its identity's result,
    its directory's record is of that identity, its outputs are as that call left them and nothing it read
    changed (or is being rewritten now). Pure: every fact comes from ``facts``."""
    key, before = facts.key, facts.before
    hit = facts.cached and before is not None and before.memo_key == key
    gone, changed = facts.spoiled if hit else ([], [])
    read = facts.stale if hit and not gone and not changed else []
    if hit and not gone and not changed and not read:
        return Verdict(key, facts.parts, before)
    why = spoiled_said(gone, changed) if gone or changed else ", ".join(read) if read else _why_it_runs(facts)
    running, anew = facts.computation
    return Verdict(key, facts.parts, before, why, tuple(changed), facts.new_call, before is not None or facts.cached,
                   running, anew)


def _why_it_runs(facts: Facts) -> str:
    """Why a call whose result is not its directory's runs (for the log): a paused sweep trial promoted (the
    sweep removed its finished call's record), or ``why_rerun``."""
    if facts.before is None and facts.cached and facts.promoted:
        return f"a sweep {facts.promoted}: it goes on from its checkpoint"
    return why_rerun(facts.call.stage, facts.call.name, facts.before, facts.parts, facts.cached)


def gate(call: StageCall, args: tuple, kwargs: Mapping[str, Any], cache: DigestCache, holds: Callable[[str], bool],
         written_now: Mapping[str, str] | None = None, code: Mapping[str, str] | None = None) -> Verdict:
    """The one skip gate of every route (the memoizer where the workflow runs, an endpoint's task, the worker
    of your own Parsl config): the call's identity (``stage_components``; ``code``: its code components read
    elsewhere), its verdict, and for a call that runs what the verdict asks before its attempt (``prepare``)."""
    parts = stage_components(call, args, dict(kwargs), cache, code)
    outputs = kwargs.get("outputs", ())
    found = decide(Facts(call, parts, outputs, cache, holds, written_now))
    return found if found.skips else dataclasses.replace(found, moved=tuple(prepare(found, call, outputs, cache)))


def prepare(verdict: Verdict, call: StageCall, outputs: Sequence[Any], cache: DigestCache) -> list[str]:
    """Before the attempt of a call that runs: its identity left in its directory, and the outputs changed
    since its call wrote them set aside (read as they are, a damaged one could fail the rerun, and every
    rerun after it); the names set aside."""
    Path(call.opts.stage_dir).mkdir(parents=True, exist_ok=True)  # (made when it was called; removed since?)
    stagedir.write(Path(call.opts.stage_dir) / stagedir.IDENTITY, stagedir.IdentityRecord(verdict.computation))
    return set_aside(call.opts.stage_dir, outputs, verdict.before, cache) if verdict.changed else []


def why_rerun(stage: str, function: str, before: stagedir.CallRecord | None, now: Mapping[str, str],
              memo_hit: bool) -> str:
    """Why the stage runs (for the log), comparing the last finished call with this one."""
    if before is None:
        return "no finished run of it in this run directory" if not memo_hit else \
            f"its directory {stage}/ was rewritten by a run that did not finish"
    changed = changed_components(function, before.components, now)
    if not changed:
        return "its last result is not in Parsl's records" if not memo_hit else "unknown change"
    if memo_hit:
        return f"the files in {stage}/ are from another call of it ({', '.join(changed)})"
    return ", ".join(changed)


#: the components compared one by one, and what their change is called
_SINGLE = (("runtime", "parsl-torch or torch changed"), ("arguments", "arguments changed"),
           ("options", "stage options changed"), ("site setup", "the site's provider.worker_init changed"))


def changed_components(function: str, old: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """What differs between two identities, in the order a user looks for it: the code, the modules and
    packages it imports, what runs it, its arguments and options, its variables, its input files."""
    keys = sorted(set(old) | set(now))
    differ = [k for k in keys if old.get(k) != now.get(k)]
    both = [k for k in differ if k in old and k in now]
    changed = [f"code of `{function}` changed"] if "code" in differ else []
    code = changed or any(k.startswith("module ") for k in differ)  # (an edited module's values are its file's)
    changed += [] if code else [f"{k[len('state '):]} " + ("changed (a value its code reads, set at run time)"
                                                           if k in both else "now read" if k in now else
                                                           "no longer read") for k in differ if k.startswith("state ")]
    for key in (k for k in differ if k.startswith("module ")):
        how = "changed" if key in both else "now imported" if key in now else "no longer imported"
        changed.append(f"{display_name(key[len('module '):])} {how}")
    changed += [f"{k} {package_change(old.get(k), now.get(k))}" for k in differ if k.startswith("package ")]
    changed += [said for key, said in _SINGLE if key in differ]
    if "accelerators" in differ:
        changed.append(f"it now runs on nodes {'with' if now.get('accelerators') else 'without'} accelerators")
    for key in (k for k in differ if k.startswith("env ")):
        changed.append(f"environment variable {key[4:]} " + ("changed" if key in both else
                                                             "now given" if key in now else "no longer given"))
    changed += [f"{k} " + ("changed" if k in both else "added" if k in now else "removed")
                for k in differ if k.startswith("input ")]
    return changed


def spoiled_said(gone: Sequence[str], changed: Sequence[str]) -> str:
    """Why a stage whose files are gone or changed runs again (``spoiled_files``)."""
    said = []
    if gone:
        said.append(f"the {' and the '.join(gone)} of its finished run {'is' if len(gone) == 1 else 'are'} missing")
    if changed:
        said.append(f"the {' and the '.join(changed)} of its finished run {'was' if len(changed) == 1 else 'were'} "
                    f"changed since that run wrote {'it' if len(changed) == 1 else 'them'}")
    return "; ".join(said)


def stale_reads(before: stagedir.CallRecord, stage_dir: str, stage_env: Mapping[str, str],
                cache: DigestCache) -> list[str]:
    """What changed since the finished call ``before`` read it (empty: its reads are as it left them)."""
    if before.reads is None:  # (a skip is a promise: without what it read, there is none to make)
        return ["what its finished run read was not observed (see the warning of that run)"]
    return changed_reads(before.reads, current(before.reads, stage_dir, stage_env, cache))


def read_paths(record: CallRecord | None) -> set[str]:
    """The files a finished call read (its record's ``read <path>`` keys)."""
    return {key[len("read "):] for key in (record.reads or {}) if key.startswith("read ") and
            not key.startswith("read folder ")} if record is not None else set()


def rewritten_now(before: CallRecord, written_now: Mapping[str, str]) -> list[str]:
    """The files the call read that a stage running now wrote in its last run: with no dependency between
    them, which of the two comes first is chance, so its skip is no promise."""
    both = sorted(read_paths(before) & set(written_now))
    return [f"input {path} is written by stage {written_now[path]!r}, which runs now with no dependency between "
            f"them (pass {written_now[path]!r}'s future to it)" for path in both]


def changed_reads(before: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """What changed among a finished call's reads, for the log, as a change of what it is given reads
    (``input /data/a.npy changed``, ``mymod.py changed``, ``environment variable X changed``)."""
    said = []
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            kind, _, what = key.partition(" ")
            path = what.removeprefix("folder ")
            if kind == "during":
                said.append(f"{display_name(what) if what.endswith('.py') else 'input ' + what} changed while its "
                            f"last run ran, after it read it")
            elif key == "env *":
                said.append("the environment's variables changed (it read all of them)")
            elif kind == "env":
                said.append(f"environment variable {what} changed")
            elif before.get(key) == "missing":
                said.append(f"{path}, which it looked for and did not find, exists now")
            elif kind in ("stat", "kind"):
                gone = now.get(key, "missing").endswith("missing")
                said.append(f"{path}, which it looked at, {'is gone' if gone else 'changed (its kind, size or time)'}")
            elif key in before and now.get(key, "missing") == "missing":
                said.append(f"{path}, which it read, is gone")
            elif kind == "listed":
                said.append(f"the folder {path} changed (its names)")
            else:
                said.append(f"{display_name(path)} changed" if path.endswith(".py") else f"input {path} changed")
    return said
