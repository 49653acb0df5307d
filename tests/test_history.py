"""History: recording, HDF5 files (h5py and xarray), crash safety, sinks, CLI."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

import parsl_torch as pt
from parsl_torch.cli import main as cli
from parsl_torch.errors import ConfigError
from parsl_torch.history.h5file import partial_path

from .conftest import RANKS_DIR, clean_env, launch


def test_update_returns_summary_and_accepts_scalars(tmp_path):
    h = pt.History("t", path=tmp_path / "h.h5")
    line = h.update({"loss": torch.tensor(0.5), "acc": np.float32(0.25), "n": 3, "ok": True})
    assert line == "step=0 loss=0.5 acc=0.25 n=3 ok=1"
    assert h.update({"loss": 0.25, "step": 10}).startswith("step=10 loss=0.25")
    assert h.update({"loss": float("nan")}).startswith("step=11 loss=nan")  # NaN is recorded
    h.update({"loss": math.inf, "new": 1.0})
    path = h.finalize(plot=False)
    data = pt.read_history(path)
    assert list(data.steps) == [0, 10, 11, 12]
    assert np.isnan(data.metrics["loss"][2]) and data.metrics["loss"][3] == math.inf
    assert np.isnan(data.metrics["acc"][1:]).all()  # keys may vanish: NaN
    assert np.isnan(data.metrics["new"][:3]).all() and data.metrics["new"][3] == 1.0


@pytest.mark.parametrize("value, needle", [
    ("fast", "metric 'loss' is 'fast', not a number"),
    (torch.ones(3), r"metric 'loss' is a tensor/array of shape \(3,\), not a number"),
    (None, "metric 'loss' is None"),
])
def test_non_numeric_metric_names_the_key(value, needle):
    with pytest.raises(ConfigError, match=needle):
        pt.History("t").update({"loss": value})


def test_file_layout_attributes_and_xarray(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567")
    h = pt.History("train", sync_every=7, config={"lr": 0.1, "globus_client_secret": "s3cr3t",  # a secret name
                                                  "run": {"wandb": "0123456789abcdef0123456789abcdef01234567"},
                                                  "notes": "hub hf_AbCdEfGhIjKlMnOp"},  # a known value, a shape
                   units={"loss": "nats"}, descriptions={"loss": "cross-entropy"})
    for i in range(20):
        h.update({"loss": 1.0 / (i + 1), "train/acc": i / 20})
    path = h.finalize(plot=False)
    assert path == tmp_path / "outputs" / "train" / "history.h5"  # the default location
    with h5py.File(path) as f:
        attrs = dict(f.attrs)
        assert attrs["schema"] == "parsl-torch/history" and attrs["schema_version"] == 1
        assert attrs["status"] == "complete" and attrs["stage"] == "train" and attrs["steps"] == 20
        for key in ("start_time", "end_time", "world_size", "nodes", "hostname", "device",
                    "backend", "versions", "git_commit", "config"):
            assert key in attrs, key
        assert "s3cr3t" not in attrs["config"] and '"lr": 0.1' in attrs["config"]
        assert "0123456789abcdef" not in attrs["config"] and "hf_AbCd" not in attrs["config"], attrs["config"]
        assert '"notes": "hub ***"' in attrs["config"]
        loss = f["loss"]
        assert loss.dtype == np.float64 and loss.compression == "gzip" and loss.chunks
        assert loss.attrs["units"] == "nats" and loss.attrs["description"] == "cross-entropy"
        assert f["train.acc"].attrs["long_name"] == "train/acc"
    ds = pt.load_history(path)
    assert list(ds["step"].values) == list(range(20))
    assert ds["loss"].dims == ("step",)
    assert ds["loss"].sel(step=3).item() == pytest.approx(0.25)


def test_finalize_twice_replaces(tmp_path):
    target = tmp_path / "h.h5"
    for n in (5, 3):  # a rerun of a stage into the same file
        h = pt.History("t")
        for i in range(n):
            h.update({"x": i})
        h.finalize(target, plot=False)
        assert len(pt.read_history(target).steps) == n
    assert not partial_path(target).exists()


def test_bad_finalize_paths_keep_the_history(tmp_path):
    h = pt.History("t", path=tmp_path / "keep" / "h.h5")
    (tmp_path / "keep").mkdir()
    h.update({"x": 1.0})
    with pytest.raises(ConfigError, match="directory .*missing for h.h5 does not exist.*kept in .*keep"):
        h.finalize(tmp_path / "missing" / "h.h5", plot=False)
    with pytest.raises(ConfigError, match="cannot write the history file /proc/h.h5"):
        h.finalize("/proc/h.h5", plot=False)
    assert pt.read_history(h.finalize(tmp_path / "h.h5", plot=False)).metrics["x"][0] == 1.0


@pytest.mark.parametrize("read_every", [1, 4], ids=["floats", "tensors-read-every-4"])
def test_killed_run_leaves_partial_readable_and_no_final_file(tmp_path, read_every):
    """Killed at step 35, syncing every 10 steps: the partial file holds steps 0-29 and their values, whether
    they were floats or tensors read every 4 steps (a sync reads what is not read yet)."""
    final = tmp_path / "train.h5"
    out = subprocess.run([sys.executable, str(RANKS_DIR / "killed_midrun.py"), str(final), str(read_every)],
                         env=clean_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == -9, out.stderr
    assert not final.exists()
    data = pt.read_history(partial_path(final))
    assert data.attrs["status"] == "running"
    assert list(data.steps) == list(range(30))  # up to the last flush (every 10 steps)
    assert list(data.metrics["loss"]) == [1.0 / (s + 1) for s in range(30)]


class _Rows:
    """A sink that keeps what it is given."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict]] = []

    def log(self, step, metrics) -> None:
        self.rows.append((step, dict(metrics)))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_tensors_are_read_every_n_steps_in_order_and_before_a_failure_is_recorded(tmp_path):
    """read_every=4: a tensor's value is read at steps that are multiples of 4 (the line shows ``…`` until
    then), kept as it was when recorded (changed in place later), NaN as NaN; the sinks get each row once
    its values are read, in order; a failure records what was not read yet."""
    sink = _Rows()
    h = pt.History("t", path=tmp_path / "h.h5", read_every=4, sinks=[sink])
    loss = torch.zeros(())
    lines = []
    for step in range(6):
        loss.fill_(float("nan") if step == 2 else step / 10)
        lines.append(h.update({"loss": loss, "lr": 0.5}))
    assert lines[0] == "step=0 loss=0 lr=0.5"  # (0 is a multiple of 4)
    assert lines[1:4] == [f"step={s} loss=… lr=0.5" for s in (1, 2, 3)] and lines[4] == "step=4 loss=0.4 lr=0.5"
    assert lines[5] == "step=5 loss=… lr=0.5" and [r[0] for r in sink.rows] == [0, 1, 2, 3, 4]
    assert sink.rows[3] == (3, {"loss": pytest.approx(0.3), "lr": 0.5}) and math.isnan(sink.rows[2][1]["loss"])
    with pytest.raises(ConfigError, match=r"metric 'loss' is a tensor of shape \(2,\), not a number"):
        h.update({"lr": 0.1, "loss": torch.ones(2)})
    with pytest.raises(RuntimeError), h:
        raise RuntimeError("the step failed")
    data = pt.read_history(partial_path(tmp_path / "h.h5"))
    assert data.attrs["status"] == "failed" and list(data.steps) == list(range(6))
    assert data.metrics["loss"][5] == pytest.approx(0.5) and np.isnan(data.metrics["loss"][2])
    assert [r[0] for r in sink.rows] == list(range(6))
    with pytest.raises(ConfigError, match=r"read_every=0: use an int >= 1"):
        pt.History("t", path=tmp_path / "x.h5", read_every=0)


def test_failure_inside_context_manager_marks_file_failed(tmp_path):
    final = tmp_path / "h.h5"
    with pytest.raises(RuntimeError):
        with pt.History("t", path=final) as h:
            h.update({"x": 1.0})
            raise RuntimeError("boom")
    data = pt.read_history(partial_path(final))
    assert data.attrs["status"] == "failed" and list(data.metrics["x"]) == [1.0]
    assert not final.exists()


def test_ezpz_style_loop(tmp_path, monkeypatch, capfd, plots):
    monkeypatch.chdir(tmp_path)
    logger = pt.get_logger("train")
    history = pt.History()
    for step in range(3):
        logger.info(history.update({"loss": 1.0 / (step + 1), "dt": 0.01}))
    path = history.finalize()
    assert "step=2 loss=0.333333 dt=0.01" in capfd.readouterr().err
    assert path.exists() and (path.parent / "history-plots" / "loss.png").exists()
    # PARSL_TORCH_PLOTS=0: no plots, for every finalize (a sweep's trials), unless one asks for them
    monkeypatch.setenv("PARSL_TORCH_PLOTS", "0")
    for name, plot in (("quiet", None), ("asked", True)):
        history = pt.History(name)
        history.update({"loss": 1.0}, step=0)
        history.update({"loss": 0.5}, step=1)
        path = history.finalize(tmp_path / f"{name}.h5", plot=plot)
        assert (tmp_path / f"{name}-plots" / "loss.png").exists() == (plot is True), name


def test_csv_sink_appends_one_row_per_step(tmp_path):
    h = pt.History("t", path=tmp_path / "h.h5", sinks=["csv"], sync_every=4)
    for i in range(10):
        h.update({"loss": i * 0.5, "lr": 0.1})
    h.finalize(plot=False)
    rows = (tmp_path / "h.csv").read_text().splitlines()
    assert rows[0] == "step,loss,lr" and len(rows) == 1 + 10
    assert rows[3] == "2,1.0,0.1"


def test_failing_sink_warns_once_and_training_goes_on(tmp_path, capfd):
    class Broken:
        def log(self, step, metrics):
            raise OSError("disk full")

        def flush(self): ...
        def close(self): ...

    h = pt.History("t", path=tmp_path / "h.h5", sinks=[Broken()])
    for i in range(5):
        h.update({"x": i})
    assert capfd.readouterr().err.count(
        "Broken.log failed (OSError: disk full); this sink is switched off for the rest of the run") == 1
    assert len(pt.read_history(h.finalize(plot=False)).steps) == 5


@pytest.mark.slow  # (wandb's service process: out of make test-fast)
@pytest.mark.lowest
def test_wandb_offline_writes_its_run_directory(tmp_path):
    code = ("import parsl_torch as pt\n"
            "h = pt.History('train', path='h.h5', sinks=['wandb'], config={'lr': 0.1})\n"
            "for i in range(5): h.update({'loss': 1.0 / (i + 1)})\n"
            "h.finalize(plot=False)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         timeout=180, env=clean_env(WANDB_MODE="offline", WANDB_DIR=str(tmp_path),
                                                    WANDB_SILENT="true"))
    assert out.returncode == 0, out.stderr
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_cli_show_and_plot(tmp_path, capsys):
    h = pt.History("train", path=tmp_path / "h.h5")
    for i in range(4):
        h.update({"loss": 4.0 - i})
    h.finalize(plot=False)
    assert cli(["history", "show", str(tmp_path / "h.h5")]) == 0
    out = capsys.readouterr().out
    assert "status complete, 4 steps" in out
    assert out.splitlines()[-1].split() == ["loss", "1", "1", "4", "2.5", "0", "rank", "0"]
    assert cli(["history", "plot", str(tmp_path / "h.h5"), "--out", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "loss.png").stat().st_size > 1000


def test_show_tells_a_loss_gone_nan_from_a_metric_not_recorded_at_the_last_step(tmp_path, capsys):
    """The loss is NaN from step 1 on: last is nan and 3 steps are not finite; an eval metric recorded at
    step 1 only keeps its last value (the steps without it are no NaN of its own)."""
    h = pt.History("train", path=tmp_path / "h.h5")
    h.update({"loss": 4.41663, "acc": 0.5})
    h.update({"loss": float("nan"), "acc": 0.75})
    h.update({"loss": float("inf")})
    h.update({"loss": float("nan")})
    h.finalize(plot=False)
    assert cli(["history", "show", str(tmp_path / "h.h5")]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["loss"] == ["nan", "4.41663", "4.41663", "4.41663", "3", "rank", "0"]
    assert rows["acc"] == ["0.75", "0.5", "0.75", "0.625", "0", "rank", "0"]
    data = pt.read_history(tmp_path / "h.h5")
    assert np.isnan(data.metrics["acc"][2:]).all()  # every reader still sees NaN where it was not recorded


def test_foreign_or_corrupt_files_are_named(tmp_path, capsys):
    (tmp_path / "junk.h5").write_bytes(os.urandom(256))
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = [1, 2]
    assert cli(["history", "show", str(tmp_path / "junk.h5")]) == 2
    assert f"{tmp_path / 'junk.h5'} is not an HDF5 file" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="other.h5 is an HDF5 file but not a parsl-torch history"):
        pt.load_history(tmp_path / "other.h5")
    with pytest.raises(ConfigError, match="does not exist"):
        pt.read_history(tmp_path / "nope.h5")
    assert cli(["history", "show", str(tmp_path / "nope.h5")]) == 2  # missing, not "damaged"
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nope.h5'} does not exist" in err and "damaged" not in err


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_cross_rank_statistics_are_exact(tmp_path, launcher, plots):
    out = launch(launcher, 2, [str(RANKS_DIR / "history_suite.py"), str(tmp_path / "h.h5"), "23", "5"])
    assert out.returncode == 0, out.stderr
    data = pt.read_history(tmp_path / "h.h5")
    steps = np.arange(23)
    assert list(data.steps) == list(steps) and data.attrs["world_size"] == 2
    s = data.stats["loss"]  # rank r logged step + r
    np.testing.assert_array_equal(s["mean"], steps + 0.5)
    np.testing.assert_array_equal(s["min"], steps)
    np.testing.assert_array_equal(s["max"], steps + 1)
    np.testing.assert_array_equal(s["std"], np.full(23, 0.5))
    np.testing.assert_array_equal(data.metrics["loss"], steps)  # rank 0's own values
    # a metric only rank 1 records: statistics over the one rank that has it
    np.testing.assert_array_equal(data.stats["only1"]["mean"], 2.0 * steps)
    np.testing.assert_array_equal(data.stats["only1"]["std"], np.zeros(23))
    assert np.isnan(data.metrics["only1"]).all()
    assert data.attrs["config"] == {"lr": 0.1, "wandb_api_key": "***"}
    ds = pt.load_history(tmp_path / "h.h5")
    assert float(ds["loss_mean"].sel(step=4)) == 4.5
    assert (tmp_path / "h-plots" / "loss.png").exists()


@pytest.mark.parametrize("metrics, message", [
    ({1: 2.0}, "metric name 1: use a non-empty string"),
    ({"": 2.0}, "metric name '': use a non-empty string"),
    ({".": 2.0}, "cannot be stored"),
    ({"x/y": 1.0, "x.y": 2.0}, "'x.y' clashes with 'x/y'"),
    ({"loss": 1.0, "loss_mean": 2.0}, "'loss_mean' clashes with 'loss'"),
    ({"big": 10 ** 400}, "the value is too large for a float"),
    ({"step": "abc", "loss": 1.0}, "step 'abc' is not a whole number"),
])
def test_bad_metric_names_and_values_are_refused_before_the_row_is_recorded(tmp_path, metrics, message):
    h = pt.History("t", path=tmp_path / "h.h5", sync_every=0)
    h.update({"ok": 1.0})
    with pytest.raises(pt.ConfigError, match=re.escape(message)):
        h.update(metrics)
    h.update({"ok": 2.0})
    path = h.finalize(plot=False)
    data = pt.read_history(path)
    assert list(data.steps) == [0, 1] and list(data.metrics["ok"]) == [1.0, 2.0]  # nothing half-recorded


@pytest.mark.slow
def test_a_partial_history_opens_after_a_kill_at_any_instant(tmp_path):
    """SIGKILL at 50 random instants of a process that flushes at every step: the partial file
    always opens and holds the steps 0..n-1 of its last completed flush."""
    import random
    import signal
    import time

    rng = random.Random(7)
    script = os.path.join(os.path.dirname(__file__), "ranks", "flush_forever.py")
    for i in range(50):
        final = tmp_path / f"h{i}.h5"
        proc = subprocess.Popen([sys.executable, script, str(final)], env={**os.environ, "OMP_NUM_THREADS": "1"})
        while not os.path.exists(f"{final}.ready") and proc.poll() is None:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        partial = tmp_path / f"h{i}.h5.partial"
        if partial.exists():
            data = pt.read_history(partial)
            assert list(data.steps) == list(range(len(data.steps))), f"kill {i}: steps {data.steps[:5]}..."
            assert data.attrs["status"] == "running"


def test_a_history_damaged_in_the_middle_is_one_clear_error(tmp_path):
    h = pt.History("c", path=tmp_path / "h.h5", sync_every=0)
    for i in range(20000):
        h.update({"a": float(i), "b": 2.0})
    path = h.finalize(plot=False)
    data = bytearray(path.read_bytes())
    data[len(data) // 3: len(data) // 3 + 4000] = b"\xab" * 4000
    path.write_bytes(bytes(data))
    with pytest.raises(pt.ConfigError, match="is damaged and cannot be read"):
        pt.read_history(path)
