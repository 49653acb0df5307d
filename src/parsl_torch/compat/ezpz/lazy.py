"""``ezpz.lazy``: ``lazy_import(name)``, a module that is loaded when one of its attributes is first used
(the standard library's ``importlib.util.LazyLoader``); a module that is not installed gives a stand-in
that raises ``ModuleNotFoundError`` when used, as ezpz's does."""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

__all__ = ["lazy_import"]


class MissingModule(types.ModuleType):
    """A module that is not installed: any use of it says so."""

    def __getattr__(self, attr: str) -> Any:
        raise ModuleNotFoundError(f"No module named {self.__name__!r} (lazily imported; install it to use "
                                  f"{self.__name__}.{attr})", name=self.__name__)


def lazy_import(name: str) -> types.ModuleType:
    """``name`` as a module, loaded on first use."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        return MissingModule(name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
