"""``ezpz.__about__``: the version, which says what this is: parsl-torch's compat layer of ezpz 0.26.1
(a PEP 440 local version: ``0.26.1+parsltorch.<parsl-torch's version>``)."""

from __future__ import annotations

from ...common.metadata import installed_version

#: the ezpz release whose names and behaviour this package follows
EZPZ_VERSION = "0.26.1"
__version__ = f"{EZPZ_VERSION}+parsltorch.{installed_version('parsl-torch') or '0'}"
