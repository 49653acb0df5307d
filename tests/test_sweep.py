"""Sweeps (``pt.sweep``): the ASHA rule, the space and its refusals before any trial starts, the record
that survives the workflow, the stop request the ranks agree on, and a real sweep cut, killed at a
random instant and run again, in separate processes as users run it."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import parsl_torch as pt
from parsl_torch.apps.sweeps.asha import Asha, rung_steps
from parsl_torch.apps.sweeps.journal import SweepRecord
from parsl_torch.apps.sweeps.space import expand, trial_name
from parsl_torch.common import settings, stagedir
from parsl_torch.errors import ConfigError

from .conftest import BIN, clean_env


def test_asha_keeps_the_best_of_each_rung_against_those_that_came_before():
    asha = Asha(eta=3, mode="min")
    first = asha.judge("a", 0, 2.0)
    assert first.keep and first.cut == 2.0  # the first at a rung is the best there so far
    second = asha.judge("b", 0, 3.0)  # worse than the rung's best third: 2 + (3 - 2) / 3
    assert not second.keep and math.isclose(second.cut, 2.0 + 1 / 3)
    assert asha.judge("c", 0, 1.0).keep  # a new best
    assert asha.judge("d", 0, 1.5).keep  # [1, 1.5, 2, 3]: the cut is the second best
    assert not asha.judge("e", 0, math.nan).keep  # a diverged loss is cut
    assert asha.judge("a", 1, 9.0).keep  # rungs are judged apart
    high = Asha(eta=2, mode="max")
    assert high.judge("a", 0, 0.5).keep and not high.judge("b", 0, 0.4).keep and high.judge("c", 0, 0.9).keep
    assert second.says("loss", "min", 5) == "rung 0 at step 5: loss 3 > cut 2.333"
    assert rung_steps(5, 3, 60) == [5, 15, 45] and rung_steps(1, 2, 9) == [1, 2, 4, 8]


def test_a_paused_trial_is_promoted_once_later_values_put_it_in_its_rungs_best_the_highest_rung_first():
    """The promotion form's rule: in the best n // eta of the n values at the rung (at least the best)."""
    from parsl_torch.apps.sweeps.asha import Promotions

    asha = Asha(eta=2, mode="min", promoting=True)
    promotions = Promotions(asha)
    assert asha.judge("a", 0, 2.0).keep  # the first at a rung is its best
    assert not asha.judge("b", 0, 3.0).keep  # [2, 3]: the best one goes on
    promotions.paused["b"] = (0, 3.0)
    assert promotions.next() is None
    assert not asha.judge("c", 0, 4.0).keep and promotions.next() is None  # [2, 3, 4]: still the best one
    promotions.paused["c"] = (0, 4.0)
    assert asha.judge("a", 1, 1.0).keep and not asha.judge("d", 1, 1.2).keep  # rung 1: [1, 1.2]
    promotions.paused["d"] = (1, 1.2)
    assert not asha.judge("e", 0, 5.0).keep  # [2, 3, 4, 5]: the best two, b ranks now
    assert promotions.next() == ("b", 0)
    assert not asha.judge("f", 1, 5.0).keep and not asha.judge("g", 1, 6.0).keep  # [1, 1.2, 5, 6] at rung 1
    assert promotions.next() == ("d", 1)  # the higher rung first
    high = Asha(eta=2, mode="max", promoting=True)
    assert high.judge("a", 0, 0.5).keep and not high.judge("b", 0, 0.4).keep
    assert Promotions(high, {"b": (0, 0.4)}).next() is None
    high.judge("c", 0, 0.1)
    high.judge("d", 0, 0.2)
    assert Promotions(high, {"b": (0, 0.4)}).next() == ("b", 0)


@pytest.mark.parametrize("call, says", [
    ({"space": []}, r"space=\[\]\): give a list of configurations"),
    ({"space": {"lr": 0.1}}, r"space\['lr'\]=0.1\): give a non-empty list"),
    ({"space": [{"lr": 0.1}, 3]}, r"space\[1\] is int"),
    ({"space": {"lrr": [0.1]}}, r"lrr"),
    ({"space": {"model.dimm": [8]}}, r"dimm"),
    ({"space": {"lr": [-1.0]}}, r"lr: must be a finite number > 0"),
    ({"metric": "accuracy"}, r"metric='accuracy'.*records loss"),
    ({"scheduler": "hyperband"}, r"scheduler='hyperband'\): use one of asha, asha-promote, none"),
    ({"scheduler": "asha-promote", "slots": 0}, r"slots=0\): the trials to run at once"),
    ({"mode": "lowest"}, r"mode='lowest'"),
    ({"min_steps": 60}, r"min_steps=60.*before the budget"),
    ({"eta": 1}, r"eta=1"),
    ({"window": 9, "min_steps": 5}, r"window=9.*1 to min_steps \(5\)"),
    ({"base": "no/such/file.yaml"}, r"base='no/such/file.yaml'"),
    ({"trial": "train"}, r"trial='train'\): give a function"),
    ({"steps": 0}, r"steps=0\): the budget of a trial"),
    ({"name": "../x"}, r"'../x-00000000' is not a stage name"),
])
def test_a_bad_space_metric_or_rule_is_refused_before_any_trial_starts(call, says):
    # outside a workflow: the refusal comes first, so nothing was submitted when it came
    with pytest.raises(ConfigError, match=says):
        pt.sweep(**{"space": {"lr": [1e-3]}, "steps": 60, **call})
    with pytest.raises(ConfigError, match="outside a workflow"):
        pt.sweep({"lr": [1e-3]}, steps=60)


def test_the_same_configuration_is_one_trial_and_keeps_its_name_when_the_space_grows():
    base = {"model": {"kind": "mlp", "dim": 8}, "lr": 1.0}
    grid = expand({"lr": [0.1, 0.2], "model.dim": [8, 16]}, base)
    assert [(c["lr"], c["model"]["dim"]) for c in grid] == [(0.1, 8), (0.1, 16), (0.2, 8), (0.2, 16)]
    assert grid[0]["model"]["kind"] == "mlp" and base["lr"] == 1.0  # the base is not changed
    listed = expand([{"lr": 0.1}, {"lr": 0.1, "model.dim": 8}, {"lr": 0.2}], base)
    assert len(listed) == 2  # the second is the first: the base has dim 8
    names = {trial_name("s", c) for c in grid}
    grown = expand({"lr": [0.1, 0.2, 0.3], "model.dim": [8, 16]}, base)
    assert names < {trial_name("s", c) for c in grown}
    assert trial_name("s", {"a": 1, "b": 2}) == trial_name("s", {"b": 2, "a": 1})


def test_the_journal_keeps_decisions_of_the_same_call_forgets_them_for_another_and_survives_a_torn_line(
        tmp_path, caplog):
    rules = {"scheduler": "asha", "metric": "loss", "mode": "min", "steps": 60, "eta": 3, "rungs": [5, 15],
             "window": 2}
    log = logging.getLogger("test-sweep")
    record = SweepRecord.open(tmp_path, "s", rules, log)
    record.add("t", {"lr": 0.1})
    record.add("u", {"lr": 0.2})
    record.decide({"trial": "t", "rung": 0, "value": 2.0, "cut": 2.0, "keep": True}, "c1")
    record.update("t", state="running")
    journal = SweepRecord.path_of(tmp_path, "s")
    with open(journal, "a") as f:
        f.write('{"decision": {"trial": "u", "ru')  # killed in the middle of a write
    again = SweepRecord.open(tmp_path, "s", rules, log)
    assert again.trials["t"].state == "running" and again.order == [["t", 0]] and again.trials["u"].decisions == []
    assert not again.forget_other_call("t", "c1") and len(again.trials["t"].decisions) == 1
    assert again.forget_other_call("t", "c2") and again.trials["t"].decisions == [] and again.order == []
    assert SweepRecord.replay(journal).trials["t"].call == "c2"
    other_rules = SweepRecord.open(tmp_path, "s", {**rules, "eta": 2}, log)
    assert set(other_rules.trials) == {"t", "u"} and other_rules.order == []
    assert "rules changed" in caplog.text and "eta" in caplog.text
    journal.write_text("{not json")
    assert SweepRecord.open(tmp_path, "s", rules, log).trials == {} and "not a sweep's journal" in caplog.text


def test_a_sampler_is_asked_for_points_and_told_each_trials_end_and_a_rerun_asks_the_same_first():
    optuna = pytest.importorskip("optuna")
    dists = {"lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True),
             "model.dim": optuna.distributions.CategoricalDistribution([16, 32])}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    sampled = pt.Sampled(study, dists, trials=3, concurrent=2)
    first, point = sampled.ask()
    assert set(point) == {"lr", "model.dim"} and 1e-4 <= point["lr"] <= 1e-1
    assert sampled.asked("s-1", first)
    again, _ = sampled.ask()
    assert not sampled.asked("s-1", again)  # the same point (here: the same trial name) is one trial
    sampled.tell("s-1", "stopped", None, [(5, 3.2)])
    pruned = study.get_trials()
    assert [t.state.name for t in pruned] == ["PRUNED", "PRUNED"] and pruned[0].intermediate_values == {5: 3.2}
    late, _ = sampled.ask()
    assert not sampled.asked("s-1", late)  # asked after the trial ended: told its end at once
    assert study.get_trials()[-1].state.name == "PRUNED" and sampled.ask() is None  # 3 asked
    rerun = pt.Sampled(optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1)), dists, trials=2)
    rerun.replay([{"lr": point["lr"], "model": {"dim": point["model.dim"]}}])
    assert rerun.ask()[1] == point  # the journal's points come first
    for bad, says in [({"study": "s"}, "give an optuna.Study"), ({"params": {"lr": [1, 2]}}, "Optuna distribution"),
                      ({"trials": 0}, r"trials=0\): use an int >= 1")]:
        with pytest.raises(ConfigError, match=says):
            pt.Sampled(**{"study": study, "params": dists, "trials": 2, **bad})


def test_an_io_endpoint_that_cannot_see_the_trials_or_does_not_answer_is_named(tmp_path, monkeypatch):
    """Through an endpoint (``trialfiles.EndpointFiles``): an I/O endpoint on another file system would find no
    trial and judge nothing (a slow grid, ranked at random): a trial that ran and is not there is its error;
    one that does not answer a look in time is named, as is where to look."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from parsl_torch.apps.sweeps import trialfiles

    ran = trialfiles.Ask(str(tmp_path / "sweep-0a1b2c3d"), None, True, (3, 9))
    with ThreadPoolExecutor(1) as elsewhere:
        with pytest.raises(ConfigError, match=r"the I/O endpoint io-1 \(globus.io_endpoint_id\) does not see "
                                              r".*sweep-0a1b2c3d, where the site's endpoint ran the trial"):
            trialfiles.EndpointFiles(elsewhere, "io-1").peek([ran], "loss", 2)
    monkeypatch.setattr(trialfiles, "IO_TIMEOUT_S", 0.2)
    silent = type("Silent", (), {"submit": lambda self, fn, *args: Future()})()
    with pytest.raises(ConfigError, match=r"the I/O endpoint io-1 .* did not run a look at the trials' files "
                                          r"within 0.2 s: is it started"):
        trialfiles.EndpointFiles(silent, "io-1").peek([ran], "loss", 2)


@pytest.fixture
def ruling(tmp_path, monkeypatch):
    """Rank 0 of a sweep's trial (call ``this-call``); ``ruling(call, keep)`` leaves the sweep's ruling at step 5."""
    from parsl_torch.core import deadline
    from parsl_torch.core.ranks import rank_state

    monkeypatch.setenv(settings.STAGE_DIR.name, str(tmp_path))
    monkeypatch.setenv(settings.CALL_ID.name, "this-call")
    monkeypatch.setattr(deadline, "STOP_POLL_S", 0.0)
    monkeypatch.setattr(deadline, "RULING_WAIT_S", 0.5)
    monkeypatch.setattr(rank_state(), "deadline", None)
    return lambda call, keep: stagedir.write(tmp_path / stagedir.RULING,
                                             stagedir.RulingRecord(call, time.time(), 5, keep, "why"))


def test_rank_zero_waits_at_a_rung_for_the_ruling_and_ranks_agree_on_a_cut_of_their_own_call_only(ruling):
    from parsl_torch.core import deadline

    assert not pt.should_checkpoint()
    ruling("this-call", True)
    waited = time.monotonic()
    deadline.await_ruling(5)  # there already: no wait
    assert time.monotonic() - waited < 0.4 and not pt.should_checkpoint()
    deadline.await_ruling(15)  # none comes (the sweep is gone): it goes on after RULING_WAIT_S
    assert time.monotonic() - waited >= 0.5 and not pt.should_checkpoint()
    ruling("another-call", False)
    assert not pt.should_checkpoint()  # a cut of another call of the stage is not this one's
    ruling("this-call", False)
    assert pt.should_checkpoint() and pt.stop_requested()


def test_an_attempt_started_again_stops_at_the_rung_a_cut_was_made_at_not_before(ruling):
    """CI, stop 93: a sweep killed after a trial's history reached rung 5 and before it was judged; rerun, the
    sweep judged it from that history while the trial, started again, was at step 2: it stopped there."""
    from parsl_torch.core import deadline

    ruling("this-call", False)  # (the cut of the killed attempt's rung 5, there as this attempt starts)
    deadline.progressed(2)
    assert not pt.should_checkpoint()
    deadline.await_ruling(5)
    assert pt.should_checkpoint() and pt.stop_requested()


def test_an_attempt_resumed_past_a_cut_rung_stops_at_once(ruling):
    from parsl_torch.core import deadline

    ruling("this-call", False)
    deadline.progressed(6)  # (its first row: resumed from a checkpoint after step 5)
    assert pt.should_checkpoint() and pt.stop_requested()


SWEEP_JOB = """
import sys
import parsl_torch as pt

base = {"model": {"kind": "mlp", "vocab_size": 32, "dim": 32, "seq_len": 16}, "data": {"batch_size": 16},
        "checkpoint_every": 5, "log_every": 50}
with pt.workflow(site="local", run_dir=sys.argv[1]):
    # (in the order trials start, their names': 5e-3 and 2e-5 first, then two poor ones, which are cut)
    trials = pt.sweep({"lr": [5e-3, 1e-5, 2e-5, 3e-5]}, base=base, steps=80, min_steps=5, eta=3, window=2,
                      ranks_per_node=1)
for t in trials:
    print("TRIAL", t.name, t.state, t.step, t.why)
"""


def _decisions(run_dir: Path, name: str = "sweep") -> list[tuple]:
    record = SweepRecord.replay(SweepRecord.path_of(run_dir, name))
    if record is None:
        return []
    by = {(d["trial"], d["rung"]): d for t in record.trials.values() for d in t.decisions}
    return [(s, r, by[s, r]["value"], by[s, r]["keep"]) for s, r in record.order]


def _run(job: Path, run_dir: Path) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, str(job), str(run_dir)], capture_output=True, text=True, timeout=600,
                         env=clean_env(MPLBACKEND="Agg"), cwd=job.parent)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


@pytest.mark.slow
def test_a_sweep_stops_cut_trials_keeps_their_files_and_a_killed_sweep_reruns_to_the_same_decisions(tmp_path):
    from parsl_torch.history.h5file import read_history
    from parsl_torch.stages import checkpoint

    job, run_dir = tmp_path / "sweep_job.py", tmp_path / "run"
    job.write_text(SWEEP_JOB)
    seed = random.randrange(1 << 30)
    delay = random.Random(seed).uniform(0.0, 3.0)
    first = subprocess.Popen([sys.executable, str(job), str(run_dir)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=clean_env(MPLBACKEND="Agg"), cwd=tmp_path,
                             start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and first.poll() is None:
        if _decisions(run_dir):
            break
        time.sleep(0.2)
    time.sleep(delay)
    os.killpg(first.pid, signal.SIGKILL)  # the workflow and everything it started, at once
    first.wait()
    before = _decisions(run_dir)
    assert before, f"no decision before the kill (seed {seed})"
    finished_before = {d.name for d in run_dir.glob("sweep-*") if (d / stagedir.CALL).exists()}

    started = time.time()
    second = _run(job, run_dir)
    after = _decisions(run_dir)
    assert after[:len(before)] == before, f"seed {seed}: the decisions made before the kill changed"
    for stage in finished_before:  # a trial that ended before the kill did not run again
        assert f"[{stage}] skipped" in second.stderr, f"seed {seed}: {stage} ran again"
    states = dict(line.split()[1:3] for line in second.stdout.splitlines() if line.startswith("TRIAL"))
    assert len(states) == 4 and set(states.values()) <= {"finished", "stopped"}, second.stdout
    stopped = [s for s, state in states.items() if state == "stopped"]
    assert len(stopped) >= 2, f"the two poor trials that started last were not cut: {second.stdout}"
    for stage in stopped:  # it stopped soon after the request, and kept what it had written
        stage_dir = run_dir / stage
        cut = stagedir.read(stage_dir / stagedir.RULING, stagedir.RulingRecord)
        ended = (stage_dir / stagedir.RESULT).stat().st_mtime
        result = next(line for line in second.stdout.splitlines() if line.startswith(f"TRIAL {stage} "))
        at = int(result.split()[3])
        assert not cut.keep and cut.step in (5, 15, 45)
        if cut.time > started:  # (cut before the kill: it stopped when its rerun started)
            assert ended - cut.time < 30, f"{stage} ended {ended - cut.time:.0f} s after it was cut"
            assert at == cut.step, f"{stage}: cut at step {cut.step}, stopped at {at}: it waits at its rungs"
        assert f"stopped at step {at} (rung " in result and " > cut " in result, result
        assert len(read_history(stage_dir / "train.h5").steps) == at
        assert checkpoint.read(stage_dir / "model.pt")["step"] == at

    third = _run(job, run_dir)
    assert _decisions(run_dir) == after
    assert all(f"[{stage}] skipped" in third.stderr for stage in states), third.stderr[-3000:]
    assert third.stdout == second.stdout
    status = subprocess.run([str(BIN / "parsl-torch"), "status", str(run_dir)], capture_output=True, text=True,
                            env=clean_env(), timeout=600)
    assert "sweep 'sweep': loss (min), 80 steps, rungs at 5, 15, 45" in status.stdout, status.stdout
    assert f"{stopped[0]}  stopped at step " in status.stdout
    assert (run_dir / "sweep-sweep.png").stat().st_size > 0


def test_a_space_whose_keys_collide_or_that_is_too_large_is_refused_and_the_callers_objects_are_not_changed():
    """A section and a dotted key into it silently became one trial (or, in the other order, "a stage name
    already used"); the caller's dict was changed; a grid of 10**6 points took 18 s before a refusal."""
    for space in ({"model.dim": [16, 32], "model": [{"dim": 8}]}, {"model": [{"dim": 8}], "model.dim": [16, 32]}):
        with pytest.raises(ConfigError, match=r"its space sets both 'model' and 'model.dim', and one would "
                                              r"overwrite the other: give 'model.dim' alone, or the whole 'model'"):
            expand(space, {"model": {"dim": 4}})
    with pytest.raises(ConfigError, match=r"space\[1\] sets both 'model' and 'model.dim'"):
        expand([{"lr": 0.1}, {"model": {"dim": 8}, "model.dim": 16}], {})
    section = {"dim": 8, "layers": [1, 2]}
    configs = expand({"model": [section], "lr": [0.1, 0.2]}, {})
    configs[0]["model"]["dim"] = 99
    configs[1]["model"]["layers"].append(3)
    assert section == {"dim": 8, "layers": [1, 2]}  # copied, not shared with the trials
    with pytest.raises(ConfigError, match=r"its space holds 1,000,000 configurations \(10 x 10 x 10 x 10 x 10 x 10\), "
                                          r"more than a sweep runs \(at most 10,000 trials"):
        expand({f"k{i}": list(range(10)) for i in range(6)}, {})



PROMOTE_JOB = """
import json, sys
import parsl_torch as pt
from parsl_torch.apps.sweeps.space import trial_name
from parsl_torch.stages.train import train

base = {"model": {"kind": "mlp", "vocab_size": 32, "dim": 32, "seq_len": 16}, "data": {"batch_size": 16},
        "checkpoint_every": 5}
# four trials, the best and the middling one first in the order they start (their names'): the best goes on (the
# first at its rung), the middling one pauses; the two worse ones put it in the best half, and it is promoted
lrs, shift = [5e-3, 1e-4, 1e-5, 2e-6], 0
while [c["lr"] for c in sorted(({"lr": lr, "log_every": 50 + i + shift} for i, lr in enumerate(lrs)),
                                 key=lambda c: trial_name("promote", c))][:2] != lrs[:2]:
    shift += 4
space = [{"lr": lr, "log_every": 50 + i + shift} for i, lr in enumerate(lrs)]
with pt.workflow(site="local", run_dir=sys.argv[1]):
    trials = pt.sweep(space, base=base, steps=10, min_steps=5, eta=2, window=2, scheduler="asha-promote", slots=1,
                      name="promote", ranks_per_node=1)
    plain = train({**base, **space[1], "steps": 10}, stage="plain", ranks_per_node=1).result()
for t in trials:
    print("TRIAL", t.name, t.state, t.step, json.dumps(t.config["lr"]), t.result["resumed_from"], t.why)
print("PLAIN", json.dumps(plain["history"]))
"""


@pytest.mark.slow
def test_a_paused_trial_is_promoted_resumes_its_computation_and_a_killed_sweep_reruns_to_the_same_decisions(tmp_path):
    """asha-promote: the middling trial pauses at its rung, its slot taken by the next; the two worse ones' values
    promote it; it goes on from its checkpoint as the same call, every step once in its history, each loss
    bitwise an uninterrupted trial's. Killed at a random instant and run again: the same decisions, and what
    ended (paused included) is not run again; a third run skips every trial."""
    from parsl_torch.history.h5file import read_history

    job, run_dir = tmp_path / "promote_job.py", tmp_path / "run"
    job.write_text(PROMOTE_JOB)
    seed = random.randrange(1 << 30)
    first = subprocess.Popen([sys.executable, str(job), str(run_dir)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=clean_env(MPLBACKEND="Agg"), cwd=tmp_path,
                             start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and first.poll() is None and not _decisions(run_dir, "promote"):
        time.sleep(0.2)
    time.sleep(random.Random(seed).uniform(0.0, 25.0))
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    before, record_before = _decisions(run_dir, "promote"), SweepRecord.replay(SweepRecord.path_of(run_dir, "promote"))
    ended_before = {d.name for d in run_dir.glob("promote-*") if (d / stagedir.CALL).exists()}

    second = _run(job, run_dir)
    after = _decisions(run_dir, "promote")
    assert after[:len(before)] == before, f"seed {seed}: the decisions made before the kill changed"
    trials = {line.split()[1]: line.split(maxsplit=6)[2:] for line in second.stdout.splitlines()
              if line.startswith("TRIAL")}
    by_lr = {float(fields[2]): (name, fields) for name, fields in trials.items()}
    best, middling, *worst = (by_lr[lr] for lr in (5e-3, 1e-4, 1e-5, 2e-6))
    assert best[1][:2] == ["finished", "10"] and middling[1][:2] == ["finished", "10"], (seed, second.stdout)
    assert all(w[1][0] == "stopped" and "not promoted" in w[1][4] for w in worst), (seed, second.stdout)
    assert middling[1][3] in ("5", "10"), f"seed {seed}: promoted, it resumed from step {middling[1][3]}"
    record = SweepRecord.replay(SweepRecord.path_of(run_dir, "promote"))
    assert record.trials[middling[0]].promoted == [0] and not any(record.trials[w[0]].promoted for w in worst)
    for stage in ended_before - {middling[0]}:  # (the middling one may have ended paused: it goes on)
        assert f"[{stage}] skipped" in second.stderr, f"seed {seed}: {stage} ran again"

    history = read_history(run_dir / middling[0] / "train.h5")
    plain = read_history(json.loads(second.stdout.split("PLAIN ", 1)[1].splitlines()[0]))
    assert list(history.steps) == list(range(10)), f"seed {seed}: {list(history.steps)}"
    assert list(history.metrics["loss"]) == list(plain.metrics["loss"]), seed  # bitwise: the same computation
    paused_at = stagedir.read(run_dir / middling[0] / stagedir.RULING, stagedir.RulingRecord)
    assert paused_at.keep and paused_at.promoted and paused_at.why.startswith("promoted from rung 0"), paused_at
    promoted_before = record_before is not None and middling[0] in record_before.trials and \
        record_before.trials[middling[0]].promoted
    if not (promoted_before and middling[0] in ended_before):  # (else it ended before the kill: skipped)
        assert f"a sweep {paused_at.why}: it goes on from its checkpoint" in second.stderr, seed

    third = _run(job, run_dir)
    assert _decisions(run_dir, "promote") == after
    assert all(f"[{stage}] skipped" in third.stderr for stage in trials), third.stderr[-3000:]
    assert third.stdout.split("PLAIN")[0] == second.stdout.split("PLAIN")[0]
    status = subprocess.run([str(BIN / "parsl-torch"), "status", str(run_dir)], capture_output=True, text=True,
                            env=clean_env(), timeout=600)
    assert f"{middling[0]}  finished, promoted at rung 0" in status.stdout, status.stdout


@pytest.mark.slow
def test_a_trial_paused_in_warm_ranks_is_promoted_and_resumes_its_computation(tmp_path):
    """The same sweep with warm ranks (a fork per call): the paused trial's promotion is the same call again in
    the group's ranks, resumed from its checkpoint, every step once, each loss bitwise an uninterrupted trial's;
    a rerun skips every trial."""
    from parsl_torch.history.h5file import read_history

    job, run_dir = tmp_path / "promote_job.py", tmp_path / "run"
    job.write_text(PROMOTE_JOB.replace("run_dir=sys.argv[1])", "run_dir=sys.argv[1], warm=True)"))
    first = _run(job, run_dir)
    assert "warm ranks: group 0 starts" in first.stderr, first.stderr[-3000:]
    trials = {float(line.split()[4]): line.split(maxsplit=6)[1:] for line in first.stdout.splitlines()
              if line.startswith("TRIAL")}
    middling = trials[1e-4]
    assert middling[1:3] == ["finished", "10"] and middling[4] == "5", first.stdout
    assert all(trials[lr][1] == "stopped" and "not promoted" in trials[lr][5] for lr in (1e-5, 2e-6)), first.stdout
    history = read_history(run_dir / middling[0] / "train.h5")
    plain = read_history(json.loads(first.stdout.split("PLAIN ", 1)[1].splitlines()[0]))
    assert list(history.steps) == list(range(10))
    assert list(history.metrics["loss"]) == list(plain.metrics["loss"])
    second = _run(job, run_dir)
    assert all(f"[{stage}] skipped" in second.stderr for stage, *_ in trials.values()), second.stderr[-3000:]
    assert second.stdout.split("PLAIN")[0] == first.stdout.split("PLAIN")[0]


def test_a_trial_of_your_own_is_paused_only_when_its_loop_resumes_else_stopped_and_said_once(tmp_path, capfd):
    """asha-promote cannot see whether your loop resumes from a checkpoint: without trial_resumes=True it says
    so once and judges by stopping (the journal's rules: asha), before any trial is submitted."""
    from concurrent.futures import Future

    def trial(config, stage, **call):
        done: Future = Future()
        done.set_result({"stopped_at": None})
        return done

    with pt.workflow(site="local", run_dir=tmp_path / "run"):
        trials = pt.sweep({"lr": [0.1, 0.2]}, steps=10, min_steps=2, trial=trial, scheduler="asha-promote", name="own")
    said = [line for line in capfd.readouterr().err.splitlines() if "are stopped at their rungs, not paused" in line]
    assert len(said) == 1 and "trial_resumes=True" in said[0]
    assert SweepRecord.replay(SweepRecord.path_of(tmp_path / "run", "own")).rules["scheduler"] == "asha"
    assert len(trials) == 2


def test_the_figure_leaves_a_gap_where_a_promoted_trial_waited():
    from parsl_torch.apps.sweeps.view import _gaps

    steps, values = _gaps(list(range(10)), [float(s) for s in range(10)], {"promoted": [0]}, [5, 15])
    assert math.isnan(values[6]) and list(steps[:6]) == [0, 1, 2, 3, 4, 5] and list(steps[7:]) == [6, 7, 8, 9]
    same = _gaps([0, 1, 2], [1.0, 2.0, 3.0], {"promoted": []}, [1])
    assert list(same[0]) == [0, 1, 2] and list(same[1]) == [1.0, 2.0, 3.0]
