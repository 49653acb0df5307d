"""The census of a warm rank's process-wide settings (``apps.warm.census``), in this process: what a
call changes is put back, and what cannot be is named (its rank then ends its warm life)."""

from __future__ import annotations

import gc
import logging
import sys

import numpy as np
import torch

from parsl_torch.apps.warm.census import Census, Setting


def test_what_a_call_changes_is_put_back_and_what_cannot_be_is_named():
    box = {"a": 1, "b": 1}
    census = Census([Setting("a", lambda: box["a"], lambda v: box.__setitem__("a", v)),
                     Setting("b", lambda: box["b"], None)])
    box.update(a=5, b=5)
    assert census.restore() == ["b"] and box["a"] == 1


def test_the_census_covers_torch_numpy_python_and_the_c_library_and_puts_them_back():
    census = Census()
    names = {s.name for s in census.settings}
    assert {"torch autocast cpu", "torch.backends.mkldnn.enabled", "torch print options", "numpy print options",
            "gc enabled", "decimal context", "sys switch interval", "rlimit RLIMIT_NOFILE", "priority", "timezone",
            "locale", "logger levels", "faulthandler"} <= names
    switch, threshold = sys.getswitchinterval(), gc.get_threshold()
    try:
        torch.set_autocast_enabled("cpu", True)
        torch.backends.mkldnn.enabled = False
        np.set_printoptions(precision=2)
        logging.getLogger("census.test").setLevel(logging.ERROR)
        sys.setswitchinterval(0.001)
        gc.set_threshold(5)
        assert census.restore() == []
        assert not torch.is_autocast_enabled("cpu") and torch.backends.mkldnn.enabled
        assert np.get_printoptions()["precision"] == 8 and logging.getLogger("census.test").level == logging.NOTSET
        assert sys.getswitchinterval() == switch and gc.get_threshold() == threshold
    finally:
        torch.set_autocast_enabled("cpu", False)
        torch.backends.mkldnn.enabled = True
        np.set_printoptions(precision=8)


def test_calls_that_leak_file_descriptors_end_the_group_before_the_rank_runs_out(tmp_path):
    import resource

    census = Census([])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    opened = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        assert census.restore() == []
        opened = [open(tmp_path / f"f{i}", "w") for i in range(130)]  # (a call's leak: never closed)
        assert census.restore()[0].startswith("open file descriptors (")
    finally:
        for f in opened:
            f.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
