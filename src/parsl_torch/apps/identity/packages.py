"""Installed packages a stage's code imports, as identity components: ``package <name>`` is the
distribution's version and the digest of its ``RECORD`` (pip's list of its files with their hashes),
so an upgrade, or a ``pip install .`` of changed code under the same version, reruns the stages that
import it; reinstalling the same files does not. torch and parsl-torch are the runtime (in every
stage's ``runtime``); the standard library has no distribution.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Mapping
from importlib import metadata

#: in every stage's ``runtime`` component already
RUNTIME = {"torch", "parsl-torch"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.lru_cache(maxsize=1)
def _distributions() -> Mapping[str, list[str]]:
    """Top-level module name -> the distributions that install it (read once per process)."""
    return metadata.packages_distributions()


def package_components(names: Iterable[str]) -> dict[str, str]:
    """``package <distribution>`` -> "<version> <RECORD digest>" for the distributions of the top-level
    module ``names`` (those without one, the standard library's, are left out)."""
    dists = {d for name in names for d in _distributions().get(name, ()) if _normal(d) not in RUNTIME}
    parts = {}
    for dist in sorted(dists):
        try:
            found = metadata.distribution(dist)
        except metadata.PackageNotFoundError:  # uninstalled since this process looked: the ranks will say
            continue
        record = found.read_text("RECORD") or ""
        parts[f"package {dist}"] = f"{found.version} {hashlib.sha256(record.encode()).hexdigest()[:16]}"
    return parts


def package_change(old: str | None, new: str | None) -> str:
    """How a ``package`` component changed, for the log."""
    if old is None or new is None:
        return "now imported" if old is None else "no longer imported"
    (was, _), (now, _) = old.split(" ", 1), new.split(" ", 1)
    return f"changed ({was} -> {now})" if was != now else f"reinstalled with other files ({now})"
