"""Warm ranks (pt.workflow(warm=True)): stages of one shape run in ranks already up, with the results,
files, errors and reruns of cold stages, each call in a fresh fork of its rank's prepared parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import parsl_torch as pt
from parsl_torch.common.gcpause import RANK_GC_THRESHOLD
from parsl_torch.errors import StageError

from .conftest import clean_env, processes_under, torch_version
from .test_early_kill import BOUND_S

pytestmark = pytest.mark.slow


@pt.distributed_app(ranks_per_node=2)
def probe(step: int, previous=None):
    """What a call sees, then it changes every piece of rank state it can."""
    import logging
    import socket

    import torch
    import torch.distributed as dist

    rank = pt.setup_torch()
    seen = {"pid": os.getpid(), "parent": os.getppid(), "host": socket.gethostname(), "rank": rank, "world": dist.get_world_size(),
            "cwd": os.getcwd(), "leak": os.environ.get("WARM_TEST_LEAK"), "dtype": str(torch.get_default_dtype()),
            "seed": torch.initial_seed(), "draw": torch.rand(1).item(), "handlers": len(logging.getLogger().handlers),
            "step": step}
    t = torch.ones(1)
    dist.all_reduce(t)
    seen["sum"] = t.item()
    print(f"probe {step} rank {rank}", flush=True)
    os.environ["WARM_TEST_LEAK"] = str(step)
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(1234)
    os.chdir("/")
    logging.getLogger().addHandler(logging.NullHandler())
    pt.cleanup()  # as many scripts end (the call's own process group: its fork's)
    return seen


@pt.distributed_app(ranks_per_node=2)
def fails_on_rank_one():
    if pt.setup_torch() == 1:
        raise ValueError("rank one gives up")
    import torch.distributed as dist

    dist.barrier()


@pt.distributed_app(ranks_per_node=2)
def stray_collective():
    import torch
    import torch.distributed as dist

    if pt.setup_torch() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never calls it: cold, rank 1's exit ends the wait


@pt.distributed_app(ranks_per_node=2, walltime=3)
def sleeps():
    time.sleep(60)


@pt.distributed_app(ranks_per_node=2)
def from_helper(x: int):
    import warmhelper  # a module of the user's, imported by the warm ranks at their first call

    return warmhelper.VALUE + x, os.getppid()


def _chain(n: int):
    results, previous = [], None
    for i in range(n):
        previous = probe(i, previous, stage=f"p{i}")
        results.append(previous)
    return [r.result(timeout=300) for r in results]


def test_a_chain_runs_in_the_same_ranks_each_call_as_clean_as_a_cold_one_and_reruns_are_skipped(tmp_path,
                                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pt.workflow(site="local", run_dir="runs/warm", warm=True) as wf:
        warm = _chain(4)
    with pt.workflow(site="local", run_dir="runs/cold") as cold_wf:
        cold = _chain(2)
    assert len({r["parent"] for r in warm}) == 1, "every call of the chain forked by one warm rank 0"
    assert len({r["pid"] for r in warm}) == 4, "each call in a fork of its own"
    for i, seen in enumerate(warm):
        assert seen["cwd"] == str(wf.run_dir / f"p{i}") and seen["step"] == i and seen["sum"] == 2
        assert seen["leak"] is None and seen["dtype"] == "torch.float32"  # the last call's changes undone
        assert (seen["handlers"], seen["world"]) == (cold[0]["handlers"], 2)
        assert (wf.run_dir / f"p{i}" / "stdout.txt").read_text().count(f"probe {i} rank") == 2
    assert cold[1]["pid"] != cold[0]["pid"]
    # torch's RNG: freshly seeded for each call, as each new process's is (not the last call's seed 1234)
    assert len({r["seed"] for r in warm}) == 4 and 1234 not in {r["seed"] for r in warm}
    assert not processes_under(wf.run_dir) and not processes_under(cold_wf.run_dir), "warm ranks left behind"

    with pt.workflow(site="local", run_dir="runs/warm", warm=False) as again:  # the same calls, cold: skipped
        futures = [probe(0, None, stage="p0")]
        assert futures[0].result(timeout=300) == warm[0] and futures[0].from_cache
    assert again.run_dir == wf.run_dir
    with pt.workflow(site="local", run_dir="runs/warm", warm=True):  # warm again: a changed call runs, in new ranks
        changed = probe(9, None, stage="p1").result(timeout=300)
    assert changed["step"] == 9 and changed["parent"] != warm[0]["parent"] and changed["cwd"] == str(wf.run_dir / "p1")
    assert not list((wf.run_dir / ".warm").iterdir()), "a run's warm groups are its own, removed at its end"


def test_a_module_edited_while_warm_ranks_are_up_is_not_run_as_it_was(tmp_path, monkeypatch):
    """The edit reruns the stage (its identity has the new file), so the ranks must run the new file: each
    call's fork imports it as it is (its parent never imports a user's module), and the group goes on."""
    helper = tmp_path / "lib" / "warmhelper.py"
    helper.parent.mkdir()
    helper.write_text("VALUE = 10\n")
    monkeypatch.syspath_prepend(str(helper.parent))
    monkeypatch.chdir(tmp_path)
    with pt.workflow(site="local", run_dir="runs", warm=True):
        first = from_helper(1, stage="a").result(timeout=300)
        same = from_helper(2, stage="b").result(timeout=300)
        helper.write_text("VALUE = 20\n")  # (as an editor saves it: same size, new mtime)
        edited = from_helper(3, stage="c").result(timeout=300)
        after = from_helper(4, stage="d").result(timeout=300)
    assert (first[0], same[0], edited[0], after[0]) == (11, 12, 23, 24)
    assert first[1] == same[1] == edited[1] == after[1]  # one warm group took every call


def test_a_failed_call_fails_its_stage_as_a_cold_one_and_its_group_goes_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pt.workflow(site="local", run_dir="runs/fail", warm=True) as wf:
        before = probe(0, stage="before").result(timeout=300)
        with pytest.raises(StageError, match=r"stage 'fails_on_rank_one' failed: rank 1 on \S+ raised ValueError: "
                                             r"rank one gives up \(exit code 1\)"):
            fails_on_rank_one().result(timeout=300)
        after = probe(1, stage="after").result(timeout=300)
        # as cold: rank 1's exit ends rank 0's wait, not the collective timeout (120 s here)
        monkeypatch.setenv("PARSL_TORCH_TIMEOUT", "120")
        began = time.monotonic()
        with pytest.raises(StageError, match=r"stage 'stray_collective' failed: rank 0 on \S+ raised"):
            stray_collective().result(timeout=300)
        assert time.monotonic() - began < 60
        with pytest.raises(StageError, match="stage 'sleeps' failed: timed out after 3 s"):
            sleeps().result(timeout=300)
    assert after["parent"] == before["parent"] and after["pid"] != before["pid"] and after["sum"] == 2
    assert "Traceback" not in (wf.run_dir / "before" / "stderr.txt").read_text()
    assert not processes_under(wf.run_dir)


def test_warm_needs_the_workflows_own_parsl_and_a_bool(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(pt.ConfigError, match=r"warm='yes'"):
        with pt.workflow(site="local", run_dir="runs/x", warm="yes"):
            pass


HOLD = """
import sys, time
import parsl_torch as pt

@pt.distributed_app(ranks_per_node=2)
def up():
    return pt.setup_torch()

with pt.workflow(site="local", run_dir=sys.argv[1], warm=True):
    up().result()
    print("holding", flush=True)
    time.sleep(60)
"""


def test_a_workflow_killed_with_warm_ranks_up_leaves_no_process(tmp_path):
    (tmp_path / "hold.py").write_text(HOLD)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(tmp_path / "hold.py"), str(run_dir)], cwd=tmp_path, env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout.readline().strip() == "holding"
    assert processes_under(run_dir / ".warm"), "the warm group should be up"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + BOUND_S
    while (left := processes_under(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"left behind {BOUND_S:g} s after the kill: {left}"
    with pt.workflow(site="local", run_dir=run_dir, warm=True):  # the next run cleans the killed one's groups up
        assert probe(0, stage="next").result(timeout=150)["sum"] == 2
    assert not list((run_dir / ".warm").iterdir())


@pt.distributed_app(ranks_per_node=2)
def leaks(step: int):
    """What the call sees of the state a cold process starts with; then it changes all of it."""
    import atexit
    import builtins
    import decimal
    import faulthandler
    import gc
    import io
    import logging
    import resource
    import signal
    import socket
    import subprocess
    import sys
    import tempfile
    import threading
    import warnings

    import numpy as np
    import torch
    import torch._dynamo

    from tests import logging_module  # noqa: F401 - its import gives its logger a handler, once per process

    pt.setup_torch()
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        sys.audit("warm.test")
        audited = False
    except RuntimeError:  # an earlier call's audit hook
        audited = True
    dynamo = torch._dynamo.config
    limit = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"
    safe = getattr(torch.serialization, "get_safe_globals", list)
    seen = {"pid": os.getpid(), "parent": os.getppid(), "grad": torch.is_grad_enabled(),
            "deterministic": torch.are_deterministic_algorithms_enabled(), "umask": umask,
            "timeout": socket.getdefaulttimeout(), "tf32": torch.backends.cuda.matmul.allow_tf32,
            "matmul": torch.get_float32_matmul_precision(),  # (raised after a call that mixed torch's two APIs)
            "fp32": [getattr(getattr(b, "matmul", b), "fp32_precision", None)  # (torch >= 2.9's API)
                     for b in (torch.backends.mkldnn, getattr(torch.backends.cudnn, "conv", None))],
            "threads": torch.get_num_threads(), "anomaly": torch.is_anomaly_enabled(),
            "flash": torch.backends.cuda.flash_sdp_enabled(), "numpy": np.geterr()["divide"],
            "sigterm": repr(signal.getsignal(signal.SIGTERM)), "stdout": type(sys.stdout).__name__,
            "recursion": sys.getrecursionlimit(), "stream_handlers": len(logging.getLogger("leaks.stream").handlers),
            "module_handlers": len(logging.getLogger("leaks.module").handlers),
            "warns_raise": any(f[0] == "error" for f in warnings.filters),
            # issue 55's census of process-wide settings
            "autocast": torch.is_autocast_enabled("cpu"), "matmul_dtype": str((torch.ones(2, 2) @ torch.ones(2, 2)).dtype),
            "logger_level": logging.getLogger("leaks.level").level, "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
            "gc": gc.isenabled(), "gc_threshold": gc.get_threshold(), "torch_print": torch._tensor_str.PRINT_OPTS.precision,
            "numpy_print": np.get_printoptions()["precision"], "decimal": decimal.getcontext().prec,
            "mkldnn": torch.backends.mkldnn.enabled, "digits": sys.get_int_max_str_digits(), "tz": list(time.tzname),
            "switch": sys.getswitchinterval(), "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "faulthandler": faulthandler.is_enabled(),
            # what the census never knew (issue 68): a fork starts every call from the prepared parent
            "denormal": torch.tensor([1e-39]).item() > 0, "dynamo_limit": getattr(dynamo, limit),
            "gelu": torch.nn.functional.gelu.__name__, "builtins": hasattr(builtins, "warm_patch"),
            "tempdir": tempfile.tempdir, "sigpipe": repr(signal.getsignal(signal.SIGPIPE)), "audited": audited,
            "putenv": subprocess.run(["sh", "-c", "printf %s \"$WARM_PUTENV\""], capture_output=True,
                                     text=True).stdout, "safe": decimal.Decimal in safe()}
    torch.set_flush_denormal(True)
    setattr(dynamo, limit, 1)
    torch.nn.functional.gelu = lambda x, approximate="none": x
    builtins.warm_patch = True
    tempfile.tempdir = os.getcwd()
    os.putenv("WARM_PUTENV", "leaked")
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.addaudithook(lambda event, _args: (_ for _ in ()).throw(RuntimeError("audit")) if event == "warm.test"
                     else None)
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals([decimal.Decimal])
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True)
    warnings.simplefilter("error")
    os.umask(0o077)
    socket.setdefaulttimeout(3.0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.set_float32_matmul_precision("medium")  # what training scripts do, then torch >= 2.9's API
    if hasattr(torch.backends.cudnn, "conv"):
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    torch.set_num_threads(seen["threads"] + 1)
    torch.autograd.set_detect_anomaly(True)
    torch.backends.cuda.enable_flash_sdp(False)
    np.seterr(all="raise")
    signal.signal(signal.SIGTERM, lambda *_: None)  # a preemption handler of this call's
    sys.stdout = io.StringIO()  # (the next call's prints would go here)
    log = logging.getLogger("leaks")  # a log file in the stage's directory: the next call's lines are not its
    log.addHandler(logging.FileHandler("leaks.log"))
    log.warning("call %d", step)
    logging.getLogger("leaks.stream").addHandler(logging.StreamHandler())  # in a cold process: one handler
    sys.setrecursionlimit(seen["recursion"] + 100)
    torch.set_autocast_enabled("cpu", True)  # the next call's fp32 matmul would return bf16
    logging.getLogger("leaks.level").setLevel(logging.ERROR)
    resource.setrlimit(resource.RLIMIT_NOFILE, (200, seen["nofile"][1]))
    gc.disable()
    gc.set_threshold(1)
    torch.set_printoptions(precision=1)
    np.set_printoptions(precision=2)
    decimal.getcontext().prec = 5
    torch.backends.mkldnn.enabled = False
    sys.set_int_max_str_digits(1000)
    os.environ["TZ"] = "Asia/Tokyo"
    time.tzset()
    sys.setswitchinterval(0.001)
    os.nice(2)
    faulthandler.disable() if seen["faulthandler"] else faulthandler.enable()
    atexit.register(lambda: open("atexit.txt", "w").write("ran"))  # runs at the call's end, as at a cold exit
    if step == 1:  # a thread nothing can stop: it dies with the call's fork
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    return seen


@pt.distributed_app(ranks_per_node=2)
def unpicklable():
    pt.setup_torch()
    return (i for i in range(3))  # a generator: no pickler takes it


def test_warm_calls_start_as_clean_as_cold_ones_whatever_the_last_call_changed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pt.workflow(site="local", run_dir="runs", warm=True) as wf:
        seen = [leaks(i, stage=f"l{i}").result(timeout=300) for i in range(3)]
        with pytest.raises(pt.StageError, match="rank 0's return value .* cannot be pickled"):
            unpicklable().result(timeout=300)
    clean = {"grad": True, "deterministic": False, "umask": seen[0]["umask"], "timeout": None, "tf32": False,
             "matmul": "highest", "fp32": ["none", "tf32"] if torch_version() >= (2, 9) else [None, None], "threads": seen[0]["threads"], "anomaly": False,
             "flash": True, "numpy": "warn", "sigterm": seen[0]["sigterm"], "stdout": seen[0]["stdout"],
             "recursion": seen[0]["recursion"], "stream_handlers": 0, "module_handlers": 1, "warns_raise": False,
             "autocast": False, "matmul_dtype": "torch.float32", "logger_level": 0, "gc": True, "torch_print": 4,
             "gc_threshold": RANK_GC_THRESHOLD,
             "numpy_print": 8, "mkldnn": True, **{k: seen[0][k] for k in ("nofile", "decimal", "digits", "tz", "switch",
                                                                          "nice", "faulthandler")},
             "denormal": True, "dynamo_limit": seen[0]["dynamo_limit"], "gelu": "gelu", "builtins": False,
             "tempdir": seen[0]["tempdir"], "sigpipe": seen[0]["sigpipe"], "audited": False, "putenv": "", "safe": False}
    assert seen[0]["dynamo_limit"] != 1 and seen[0]["sigpipe"] != repr(signal.SIG_DFL)  # (call 0 set these)
    assert seen[0]["tempdir"] != str(wf.run_dir / "l0")
    for s in seen:
        assert {k: s[k] for k in clean} == clean, s
    assert len({s["parent"] for s in seen}) == 1 and len({s["pid"] for s in seen}) == 3  # one group, a fork a call
    assert [(wf.run_dir / f"l{i}" / "leaks.log").read_text() for i in range(3)] == [f"call {i}\n" * 2 for i in range(3)]
    assert all((wf.run_dir / f"l{i}" / "atexit.txt").read_text() == "ran" for i in range(3))
    with pt.workflow(site="local", run_dir="cold") as cold:  # and cold alike
        with pytest.raises(pt.StageError, match="rank 0's return value .* cannot be pickled"):
            unpicklable().result(timeout=300)
    for run_dir in (wf.run_dir, cold.run_dir):
        stderr = (run_dir / "unpicklable" / "stderr.txt").read_text()
        assert "Traceback" in stderr and "generator" in stderr
        assert not list(run_dir.rglob("*.tmp"))

