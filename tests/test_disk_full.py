"""A file system that fills up (a quota spent) while a run writes: each write that fails says so, naming
the file, the room left and the fix, instead of torch's ``unexpected pos`` or a stage that failed with no
record of why; what was written before stays whole, and the rerun, with room again, resumes from it.
Each test mounts a small tmpfs of its own (root: CI runs as root)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import parsl_torch as pt
from parsl_torch.common.files import write_atomic
from parsl_torch.errors import ConfigError, StageError
from parsl_torch.history.h5file import H5Writer, read_history
from parsl_torch.stages import checkpoint
from parsl_torch.stages.train import train

from .conftest import BIN

MB = 1 << 20
#: its checkpoint is ~9.6 MB (sharded over 2 ranks), so the disk below holds one, not two
TRAIN = {"steps": 30, "checkpoint_every": 10, "log_every": 10, "strategy": "fsdp",
         "model": {"dim": 128, "n_layers": 4}}


@pytest.fixture
def disk(tmp_path):
    """A 24 MB file system of the test's own."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True,
                          text=True) if os.geteuid() == 0 else None
    if made is None or made.returncode != 0:
        if os.environ.get("PARSL_TORCH_REQUIRE_CLUSTER"):  # CI runs as root: there it must run
            pytest.fail(f"PARSL_TORCH_REQUIRE_CLUSTER is set but a tmpfs cannot be mounted here: "
                        f"{made.stderr if made else 'not root'}")
        pytest.skip("mounting a small file system needs root")
    yield mount
    subprocess.run(["umount", "--lazy", str(mount)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """A file taking all the room on ``disk`` but ``leave`` bytes."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        room = shutil.disk_usage(disk).free - leave
        while room > 0:
            room -= f.write(b"\0" * min(MB, room))
    return filler


def test_a_full_disk_is_refused_at_the_start_and_fails_no_write_halfway(disk):
    filler = fill(disk, 0)
    with pytest.raises(ConfigError, match=rf"cannot write run directory {disk}/runs \(No space left on device\): "
                                          rf"free space there \(or have the quota raised\) or pick another --run-dir"):
        with pt.workflow(site="local", run_dir=disk / "runs"):
            pass
    # a small file: the old one stays, with no half of a new one beside it
    filler.unlink()
    write_atomic(disk / "status.json", "old")
    fill(disk, 0)
    with pytest.raises(OSError):
        write_atomic(disk / "status.json", "new" * 100_000)
    assert (disk / "status.json").read_text() == "old" and sorted(p.name for p in disk.iterdir()) == [
        "filler", "runs", "status.json"]

    # a history: the write that fails says so; the file keeps every row before it, and no copy is left
    filler.unlink()
    final = disk / "train.h5"
    writer = H5Writer(final, {"stage": "train"}, {})
    steps = np.arange(100)
    writer.append(steps, {"loss": steps * 0.5}, {}, {})
    fill(disk, 0)
    with pytest.raises(OSError, match=rf"\[Errno 28\] cannot write {final}.partial: No space left on device \(its "
                                      rf"file system is full; 0 B free\): free space there \(or have the quota "
                                      rf"raised\), then run again; the file keeps the history as it was before "
                                      rf"this write \(100 rows\)"):
        writer.append(np.arange(100, 200), {"loss": np.ones(100)}, {}, {})
    assert not (disk / "train.h5.partial.tmp").exists()
    kept = read_history(disk / "train.h5.partial")
    assert list(kept.steps) == list(range(100)) and kept.metrics["loss"][-1] == 49.5


@pytest.mark.slow
def test_a_checkpoint_that_does_not_fit_names_the_full_disk_and_the_rerun_resumes_from_the_last(
        disk, monkeypatch):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    run_dir = disk / "runs"
    with pt.workflow(site="local", run_dir=run_dir):
        filler = fill(disk, 14 * MB)  # the first checkpoint fits, the second does not
        with pytest.raises(StageError) as failed:
            train(TRAIN, ranks_per_node=2, outputs=["train.h5", "model.pt"]).result()
    ckpt = run_dir / "train" / "model.pt"
    head = str(failed.value).splitlines()[0]
    assert re.match(r"stage 'train' failed: rank [01] on ", head) and (
        f"raised OSError: [Errno 28] cannot write {ckpt}: No space left on device (its file system is full; "
        f"0 B free): free space there (or have the quota raised), then run again; the checkpoint saved before "
        f"is kept: a rerun resumes from it (exit code 1)") in head, head
    # the failed save's shards are gone (they would fill the disk the rerun needs); step 10's are whole
    assert ckpt.resolve().name == "000000010" and os.listdir(ckpt.parent / "model.pt.steps") == ["000000010"]

    filler.unlink()
    with pt.workflow(site="local", run_dir=run_dir):
        result = train(TRAIN, ranks_per_node=2, outputs=["train.h5", "model.pt"]).result()
    history = pt.read_history(run_dir / "train" / "train.h5")
    assert result["steps"] == 30 and list(history.steps) == list(range(30))  # every step once
    assert history.attrs["segments"] == [[0, 2], [10, 2]]  # resumed at step 10

    # its export to one file, where that file does not fit (torch's own 'unexpected pos' there too)
    fill(disk, 2 * MB)
    with pytest.raises(OSError, match=rf"cannot write {disk}/one.pt: No space left on device .*; {ckpt} is as it was"):
        checkpoint.export(ckpt, disk / "one.pt")
    assert not (disk / "one.pt.tmp").exists() and ckpt.resolve().name == "000000030"


@pytest.mark.slow
def test_a_stage_that_fills_the_disk_fails_saying_so_without_a_flood_of_logging_errors(disk, monkeypatch, capfd):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")

    @pt.distributed_app(ranks_per_node=2)
    def fills(path):
        import contextlib
        import time

        if pt.get_rank() == 0:
            with open(path, "wb") as f, contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
        time.sleep(3)  # (Parsl logs while it waits: to a file on the full disk)
        return "its return value cannot be written either"

    with pt.workflow(site="local", run_dir=disk / "runs"):
        with pytest.raises(StageError) as failed:
            fills(str(disk / "big.bin")).result()
    os.truncate(disk / "big.bin", (disk / "big.bin").stat().st_size - 40_000)  # room to start, not to run a stage
    with pt.workflow(site="local", run_dir=disk / "runs"):
        with pytest.raises(StageError) as then:
            fills(str(disk / "more.bin"), stage="then").result()
    assert str(then.value) == (f"stage 'then' failed: No space left on device, writing its files in {disk}/runs/then "
                               f"(0 B free): free space there (or have the quota raised), then run again")
    os.truncate(disk / "big.bin", (disk / "big.bin").stat().st_size - 12_000)  # room for the run lock, not Parsl
    with pytest.raises(ConfigError, match=rf"cannot start Parsl in {disk}/runs/parsl \(No space left on device; "
                                          rf"0 B free\): free space there \(or have the quota raised\) or pick"):
        with pt.workflow(site="local", run_dir=disk / "runs"):
            pass
    stage_dir = disk / "runs" / "fills"
    # the launch could not write its record of which rank failed: the error says where the room is missing
    assert str(failed.value).startswith(
        f"stage 'fills' failed: a rank failed, and there is no room in its directory {stage_dir} (No space left "
        f"on device; 0 B free) for what the stage writes (its outputs, its record, the end of stderr.txt): free "
        f"space there (or have the quota raised), then run again (exit code 1)"), failed.value
    err = capfd.readouterr().err  # (the interchange's too: another process, on this terminal)
    assert "Logging error" not in err, err[-3000:]  # (Python's traceback for each record: thousands)
    for run in ("000", "001"):
        assert err.count(f"cannot write the log {disk}/runs/parsl/{run}/parsl.log") == 1, err[-3000:]
    assert err.count(f"cannot write {disk}/runs/status.json (No space left on device)") == 3, err[-3000:]


@pytest.mark.slow
def test_a_stage_whose_record_cannot_be_written_still_returns_and_runs_again_next_time(tmp_path, monkeypatch, capfd):
    """The call's record (.call.json) is written in Parsl's done callback, after the stage finished: a disk
    that filled up just then (a test beside it filling the machine's disk) raised there, and Parsl left the
    stage's future unresolved, the workflow waiting on it for ever. Now the result arrives, the log says
    the record is missing, and the next run runs the stage again instead of skipping it."""
    from parsl_torch.apps import identity

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "runs" / "answer" / ".call.json"))

    @pt.distributed_app(ranks_per_node=1)
    def answer():
        return 42

    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as patched:
        patched.setattr(identity, "write_call", full)
        with pt.workflow(site="local", run_dir="runs"):
            assert answer().result(timeout=120) == 42
    err = capfd.readouterr().err
    assert (f"[answer] finished, but its record could not be written in {tmp_path / 'runs' / 'answer'} ([Errno 28] "
            f"No space left on device") in err, err
    assert not (tmp_path / "runs" / "answer" / ".call.json").exists()
    with pt.workflow(site="local", run_dir="runs"):
        assert answer().result(timeout=120) == 42
    assert "[answer] runs" in capfd.readouterr().err
    assert (tmp_path / "runs" / "answer" / ".call.json").exists()
