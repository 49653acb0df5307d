"""Layer 0, everywhere. One exception family: every user mistake is a ParslTorchError whose message
names the value, where it came from, and the fix."""

from __future__ import annotations


class ParslTorchError(Exception):
    """Base of every error parsl-torch raises on purpose."""


class ConfigError(ParslTorchError, ValueError):
    """A bad argument or configuration value (strategy, backend, plan...)."""


class TopologyError(ParslTorchError, RuntimeError):
    """The launcher's environment does not describe a usable set of ranks."""


class SiteError(ParslTorchError):
    """A site file or site name that cannot be used."""


class StageError(ParslTorchError, RuntimeError):
    """A workflow stage failed."""
