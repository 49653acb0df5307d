"""The record of a sweep that survives its workflow: ``<run_dir>/.sweep.<name>.jsonl``, a journal.

Each event (a trial known, a decision with the call it was made on, a promotion, a trial's end) is one line appended
to the file: a decision costs one short write however many trials the sweep has (rewriting a whole
record at 1,000 trials took 170 ms), and a workflow killed in the middle of a write loses at most
that line (a line that does not parse is the end of the journal). Reading it replays the lines.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...common.files import write_atomic


@dataclass
class TrialRecord:
    config: dict[str, Any]
    state: str = "pending"  # pending | running | paused | stopped | finished | failed
    step: int | None = None  # where it stopped, or its budget when it finished
    call: str | None = None  # the call its decisions were made on (another call: made again)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    result: Any = None  # its stage's result (the train stage's summary)
    value: float | None = None  # the metric at its last step (finished trials: how they rank)
    why: str = ""  # stopped: at which rung and cut; failed: the error
    promoted: list[int] = field(default_factory=list)  # the rungs it was paused at and promoted from
    busy_s: float | None = None  # the seconds its attempts held a slot

    @property
    def alive(self) -> bool:
        """Whether it went on at every rung it was judged at (or was promoted from it)."""
        return all(d["keep"] or d["rung"] in self.promoted for d in self.decisions)


class SweepRecord:
    """The rules, each trial's state and the decisions in the order they were made (their order is what
    an asynchronous rule judges by). Every change goes to the journal as it is made."""

    def __init__(self, path: Path, rules: dict[str, Any]) -> None:
        self.path, self.rules = path, rules
        self.trials: dict[str, TrialRecord] = {}
        self.order: list[list[Any]] = []  # [trial, rung] as decided
        self.whole = 0  # bytes of the journal that replayed (a kill may have cut the line after them)

    @staticmethod
    def path_of(run_dir: Path, name: str) -> Path:
        return Path(run_dir) / f".sweep.{name}.jsonl"

    @classmethod
    def replay(cls, path: Path) -> SweepRecord | None:
        """The record as its journal left it (None: no journal, or not one)."""
        try:
            data = path.read_bytes()
            first, _, rest = data.partition(b"\n")
            record = cls(path, json.loads(first)["rules"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        record.whole = len(first) + 1
        for line in rest.split(b"\n")[:-1]:  # (the last piece: empty, or a line cut short)
            try:
                record._apply(json.loads(line))
            except (ValueError, KeyError, TypeError):
                break  # (cut short by a kill: the journal ends there)
            record.whole += len(line) + 1
        return record

    @classmethod
    def open(cls, run_dir: Path, name: str, rules: dict[str, Any], log: Any) -> SweepRecord:
        """This sweep's record: the journal's, if it was kept under the same rules; else a new journal
        (of the same trials, without decisions: they are made again)."""
        path = cls.path_of(run_dir, name)
        old = cls.replay(path)
        if old is not None and old.rules == rules:
            if path.stat().st_size > old.whole:  # a line cut short by a kill: later lines go after the whole ones
                os.truncate(path, old.whole)
            return old
        if old is not None:
            log.warning("sweep %r: its rules changed since %s was written (%s): its decisions are made again",
                        name, path, ", ".join(k for k in rules if rules[k] != old.rules.get(k)))
        elif path.exists():
            log.warning("sweep %r: %s is not a sweep's journal: its decisions are made again", name, path)
        record = cls(path, rules)
        known = [{"trial": k, "config": t.config} for k, t in (old.trials.items() if old else ())]
        write_atomic(path, "".join(map(_line, [{"rules": rules}, *known])))
        for entry in known:
            record._apply(entry)
        return record

    def as_dict(self) -> dict[str, Any]:
        return {"rules": self.rules, "trials": {k: asdict(v) for k, v in self.trials.items()}, "order": self.order}

    # -- changes: each is a line of the journal ---------------------------------------------------
    def add(self, trial: str, config: dict[str, Any]) -> None:
        if trial not in self.trials:
            self._log({"trial": trial, "config": config})

    def keep_only(self, trials: set[str]) -> None:
        """The trials of this sweep's space (one left out of it since is forgotten, with its decisions)."""
        for trial in [k for k in self.trials if k not in trials]:
            self._log({"drop": trial})

    def decide(self, decision: dict[str, Any], call: str | None) -> None:
        self._log({"decision": decision, "call": call})

    def promote(self, trial: str, rung: int) -> None:
        """A trial paused at ``rung`` goes on."""
        self._log({"promote": trial, "rung": rung})

    def update(self, trial: str, **fields: Any) -> None:
        """A trial's state, step, result, value or why, where they changed."""
        t = self.trials[trial]
        changed = {k: v for k, v in fields.items() if getattr(t, k) != v}
        if changed:
            self._log({"update": trial, **changed})

    def forget_other_call(self, trial: str, call: str | None) -> bool:
        """Whether ``trial``'s decisions were made on another call than ``call`` (its code, config or inputs
        changed): then they are forgotten, to be made again."""
        t = self.trials[trial]
        if t.call and call and t.call != call and t.decisions:
            self._log({"forget": trial, "call": call})
            return True
        return False

    def _log(self, entry: dict[str, Any]) -> None:
        with open(self.path, "a") as f:  # (one line, one write: appended whole or cut at the end)
            f.write(_line(entry))
        self._apply(entry)

    def _apply(self, entry: dict[str, Any]) -> None:
        if "trial" in entry:
            self.trials[entry["trial"]] = TrialRecord(entry["config"])
        elif "drop" in entry:
            self.trials.pop(entry["drop"])
            self.order = [o for o in self.order if o[0] != entry["drop"]]
        elif "decision" in entry:
            d = entry["decision"]
            t = self.trials[d["trial"]]
            t.decisions.append(d)
            t.call = entry["call"] or t.call
            self.order.append([d["trial"], d["rung"]])
        elif "forget" in entry:
            t = self.trials[entry["forget"]]
            t.decisions, t.why, t.call, t.promoted = [], "", entry["call"], []
            self.order = [o for o in self.order if o[0] != entry["forget"]]
        elif "promote" in entry:
            t = self.trials[entry["promote"]]
            t.promoted.append(entry["rung"])
            t.state, t.why = "running", ""
        elif "update" in entry:
            t = self.trials[entry["update"]]
            for k, v in entry.items():
                if k != "update":
                    setattr(t, k, v)
        else:
            raise KeyError(f"not a sweep journal's line: {entry}")


def _line(entry: dict[str, Any]) -> str:
    return json.dumps(entry, default=str) + "\n"
