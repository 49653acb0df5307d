"""The settings registry: a bad value of any variable is refused with the variable's name and
what to give; unset or empty means the default."""

from __future__ import annotations

import pytest

from parsl_torch.common import settings
from parsl_torch.errors import ConfigError

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
