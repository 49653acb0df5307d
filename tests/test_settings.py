"""The settings registry: a bad value of any variable is refused with the variable's name and
what to give; unset or empty means the default."""

from __future__ import annotations

import re
import subprocess

import pytest

from parsl_torch.common import settings
from parsl_torch.errors import ConfigError

from .conftest import BIN, clean_env

BAD = {settings.seconds: ("soon", "0", "-3", "inf"), settings.epoch: ("tomorrow", "-1", "nan"),
       settings.gpu_order: ("3,two,1",), settings.INPUT_HASH.parse: ("md5",), settings.tflops: ("fast", "0", "inf"),
       settings.TIMEOUT.parse: ("soon", "0", "1e-9", "1e308", "nan"),  # 1e308 killed every rank (OverflowError)
       settings.NODE_TIMEOUT.parse: ("1.5", "5", "soon"),  # under 3 heartbeats: healthy nodes called lost
       settings.LOG_LEVEL.parse: ("garbage", "verbose")}


@pytest.mark.parametrize("setting", [s for s in settings.REGISTRY.values() if s.parse in BAD], ids=lambda s: s.name)
def test_a_bad_value_names_the_variable_and_what_to_give(setting):
    for bad in BAD[setting.parse]:
        with pytest.raises(ConfigError, match=rf"^{setting.name}={bad!r}: (give|not|use)"):
            setting.get({setting.name: bad})


def test_unset_or_blank_is_the_default_and_values_are_parsed():
    assert settings.TIMEOUT.get({}) == settings.TIMEOUT.get({"PARSL_TORCH_TIMEOUT": "  "}) == 300.0
    assert settings.TIMEOUT.get({"PARSL_TORCH_TIMEOUT": "12.5"}) == 12.5
    assert settings.GPU_ORDER.get({"PARSL_TORCH_GPU_ORDER": "3,2,1,0"}) == (3, 2, 1, 0)
    assert settings.INPUT_HASH.get({"PARSL_TORCH_INPUT_HASH": "STAT"}) == "stat"
    assert settings.PROGRESS.get({"PARSL_TORCH_PROGRESS": "0"}) is False
    assert settings.PROGRESS.get({"PARSL_TORCH_PROGRESS": "yes"}) is True


def test_a_bad_timeout_stops_setup_before_any_process_group(monkeypatch):
    from parsl_torch.core.dist import collective_timeout

    monkeypatch.setenv("PARSL_TORCH_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="PARSL_TORCH_TIMEOUT=.soon.: give a number of seconds from 1 to"):
        collective_timeout()


@pytest.mark.parametrize("name, value, said", [
    ("PARSL_TORCH_PEAK_TFLOPS", "abc", "dense bf16 peak in TFLOP/s, a number > 0"),
    ("PARSL_TORCH_PEAK_TFLOPS", "-5", "dense bf16 peak in TFLOP/s, a number > 0"),
    ("PARSL_TORCH_TIMEOUT", "1e308", "from 1 to 604800 (7 days) (a longer wait is no wait"),
    ("PARSL_TORCH_TIMEOUT", "0.5", "from 1 to 604800 (7 days): below 1 s every collective"),
])
def test_every_user_setting_is_checked_where_the_launch_starts_with_a_message_that_fits(name, value, said):
    """A setting that only feeds a metric (PARSL_TORCH_PEAK_TFLOPS=abc) killed training 8 s in, on the ranks;
    1e308 was called too short. Now `launch` (and a workflow, the same call) refuses it before anything starts."""
    with pytest.raises(ConfigError, match=re.escape(f"{name}={value!r}: ") + ".*" + re.escape(said)):
        settings.check_user_settings({name: value})
    out = subprocess.run([str(BIN / "parsl-torch"), "launch", "--", "true"], capture_output=True, text=True,
                         env=clean_env(**{name: value}), timeout=60)
    assert out.returncode == 2 and out.stderr.startswith(f"parsl-torch: error: {name}={value!r}: "), out.stderr
