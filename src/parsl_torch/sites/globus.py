"""Globus Compute clients and executors for the sites that reach a machine
through an endpoint: credentials checked before anything can prompt.

Credentials: ``GLOBUS_COMPUTE_CLIENT_ID``/``GLOBUS_COMPUTE_CLIENT_SECRET``
(non-interactive), else the user's existing login; with neither and no
terminal to log in from, a clear error instead of a prompt that would hang.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError

_CREDENTIAL_VARS = ("GLOBUS_COMPUTE_CLIENT_ID", "GLOBUS_COMPUTE_CLIENT_SECRET")


def _has_login(home: Path) -> bool:
    """Tokens from an earlier interactive login (globus-compute's token store)."""
    return any((home / ".globus_compute" / name).exists() for name in ("storage.db", "credentials"))


def make_client(*, client_class: Callable[..., Any] | None = None, env: Mapping[str, str] | None = None,
                interactive: bool | None = None) -> Any:
    """A Globus Compute Client, or a ConfigError when it could only prompt with nobody there.

    ``client_class`` replaces ``globus_compute_sdk.Client`` (tests pass a mock:
    constructing the real one makes network calls).
    """
    env = os.environ if env is None else env
    interactive = sys.stdin.isatty() if interactive is None else interactive
    has_env = all(env.get(v) for v in _CREDENTIAL_VARS)
    if any(env.get(v) for v in _CREDENTIAL_VARS) and not has_env:
        missing = next(v for v in _CREDENTIAL_VARS if not env.get(v))
        raise ConfigError(f"{missing} is not set: set both {' and '.join(_CREDENTIAL_VARS)} "
                          f"for non-interactive use, or neither")
    if not (has_env or _has_login(Path(env.get("HOME", "~")).expanduser()) or interactive):
        raise ConfigError("no Globus credentials and no terminal to log in from: set "
                          f"{' and '.join(_CREDENTIAL_VARS)} (a confidential client), or run "
                          "`globus-compute-endpoint login` once in a terminal")
    if client_class is None:
        from globus_compute_sdk import Client as client_class
    return client_class()


def make_executor(endpoint_id: str, *, client: Any = None, user_endpoint_config: dict | None = None,
                  resource_specification: dict | None = None) -> Any:
    """The one place a Globus Compute Executor is built."""
    from globus_compute_sdk import Executor

    return Executor(endpoint_id=endpoint_id, client=client if client is not None else make_client(),
                    user_endpoint_config=user_endpoint_config, resource_specification=resource_specification)
