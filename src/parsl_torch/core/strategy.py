"""The names of the wrapping strategies, without importing torch (configs are
checked in the workflow process, which never needs torch)."""

from __future__ import annotations

from ..errors import ConfigError

STRATEGIES = ("none", "ddp", "fsdp", "fsdp+tp")


def normalize_strategy(strategy: str) -> str:
    """``strategy`` spelled canonically (fsdp_tp, fsdp-tp -> fsdp+tp; fsdp2, torch's name of the FSDP that
    ``fsdp`` is, -> fsdp), or a ConfigError."""
    name = strategy.strip().lower().replace("_", "+").replace("-", "+").replace("fsdp2", "fsdp")
    if name not in STRATEGIES:
        raise ConfigError(f"strategy={strategy!r} is unknown: use one of {', '.join(STRATEGIES)}")
    return name
