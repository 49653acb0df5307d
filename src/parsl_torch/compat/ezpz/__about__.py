"""``ezpz.__about__``: the version, which says what this is: parsl-torch's compat layer of ezpz 0.26.1
(a PEP 440 local version: ``0.26.1+parsltorch.<parsl-torch's version>``)."""

from __future__ import annotations

#: the ezpz release whose names and behaviour this package follows
EZPZ_VERSION = "0.26.1"


def _parsl_torch_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("parsl-torch")
    except PackageNotFoundError:
        return "0"


__version__ = f"{EZPZ_VERSION}+parsltorch.{_parsl_torch_version()}"
