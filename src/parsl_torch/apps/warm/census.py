"""A census of a warm rank's process-wide settings: every one that torch, numpy, Python and the C
library expose with a way to read it, taken as the group started, compared after each call and put
back where a call changed it (``rank``), so the next call finds what a fresh process has.

``baseline`` puts back what it knows how to (the environment, the loggers' handlers, torch's precision
flags...); the census then reads everything again. A setting that still differs (it cannot be set
back: a hard rlimit lowered by a user without the right to raise it) ends the rank's warm life: the
next call gets fresh ranks, and the log says which setting.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import decimal
import faulthandler
import gc
import locale
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from .baseline import importing

#: device types whose autocast state a call may switch on (``torch.set_autocast_enabled("cpu", True)``)
DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "xla", "ipu")
#: a logger's state in a fresh process: level NOTSET, propagating, enabled
_FRESH_LOGGER = (logging.NOTSET, True, False)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One process-wide setting: how to read it, and how to put a value back (None: it cannot be)."""

    name: str
    get: Callable[[], Any]
    put: Callable[[Any], Any] | None


class Census:
    """The settings' values as the group started; ``restore`` puts back what a call changed."""

    def __init__(self, settings: list[Setting] | None = None) -> None:
        self.settings = all_settings() if settings is None else settings
        self.values = {s.name: _read(s) for s in self.settings}
        self.exits: list[tuple[Callable, tuple, dict]] = []  # atexit callbacks a call registered
        _note_exit_callbacks(self.exits)

    def restore(self) -> list[str]:
        """Put back each setting that differs; the names of those that still differ (the rank must end)."""
        left = []
        for setting in self.settings:
            before = self.values[setting.name]
            if _read(setting) == before:
                continue
            if setting.put is not None:
                with contextlib.suppress(Exception):  # (checked below: what could not be put back is said)
                    setting.put(before[1])
            if _read(setting) != before:
                left.append(setting.name)
        if (fds := _too_many_open_files()) is not None:
            left.append(fds)
        return left

    def run_exit_callbacks(self) -> None:
        """A call's ``atexit`` callbacks run at its end (in its stage's directory), as its process's would at
        exit, then are gone."""
        while self.exits:
            func, args, kwargs = self.exits.pop()
            atexit.unregister(func)
            try:
                func(*args, **kwargs)
            except Exception:  # noqa: BLE001 - as atexit does: print it, go on
                traceback.print_exc()


def _too_many_open_files() -> str | None:
    """File descriptors are not put back (one left open may be a module's, in use), but calls that leak them
    must not run the rank out of them: past half its limit, the group ends."""
    import resource

    try:
        count, limit = len(os.listdir("/proc/self/fd")), resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except OSError:
        return None
    return f"open file descriptors ({count} of at most {limit})" if 0 < limit < 2 * count else None


def _read(setting: Setting) -> tuple[str, Any]:
    try:
        return ("ok", setting.get())
    except Exception as exc:  # noqa: BLE001 - a setting whose read raises is compared by what it raised
        return ("raises", type(exc).__name__)


def _note_exit_callbacks(exits: list) -> None:
    """From now on, a callback registered outside an import is the call's (one a module registers as it is
    imported is the module's, and stays)."""
    register = atexit.register

    def noted(func: Callable, *args: Any, **kwargs: Any) -> Callable:
        register(func, *args, **kwargs)
        if not importing():
            exits.append((func, args, kwargs))
        return func

    atexit.register = noted  # type: ignore[assignment]


def all_settings() -> list[Setting]:
    """The settings this process has (a torch without a device type, a platform without an rlimit: left out)."""
    return [*_python(), *_c_library(), *_torch(), *_numpy(), _loggers()]


def _python() -> list[Setting]:
    s = [Setting("sys switch interval", sys.getswitchinterval, sys.setswitchinterval),
         Setting("sys recursion limit", sys.getrecursionlimit, sys.setrecursionlimit),
         Setting("sys profile", sys.getprofile, sys.setprofile),
         Setting("sys trace", sys.gettrace, sys.settrace),
         Setting("sys asyncgen hooks", lambda: tuple(sys.get_asyncgen_hooks()), lambda v: sys.set_asyncgen_hooks(*v)),
         Setting("gc enabled", gc.isenabled, lambda on: gc.enable() if on else gc.disable()),
         Setting("gc threshold", gc.get_threshold, lambda v: gc.set_threshold(*v)),
         Setting("gc debug", gc.get_debug, gc.set_debug),
         Setting("faulthandler", faulthandler.is_enabled,
                 lambda on: faulthandler.enable(sys.__stderr__) if on else faulthandler.disable()),
         Setting("decimal context", lambda: repr(decimal.getcontext()), lambda _: decimal.setcontext(decimal.Context())),
         Setting("logging disable", lambda: logging.root.manager.disable, logging.disable),
         Setting("threading excepthook", lambda: threading.excepthook, lambda v: setattr(threading, "excepthook", v))]
    s += [Setting(f"sys {hook}", lambda h=hook: getattr(sys, h), lambda v, h=hook: setattr(sys, h, v))
          for hook in ("displayhook", "unraisablehook", "breakpointhook")]
    if hasattr(sys, "get_int_max_str_digits"):
        s.append(Setting("sys int max str digits", sys.get_int_max_str_digits, sys.set_int_max_str_digits))
    if hasattr(sys, "getdlopenflags"):
        s.append(Setting("sys dlopen flags", sys.getdlopenflags, sys.setdlopenflags))
    return s


def _c_library() -> list[Setting]:
    import resource
    import signal

    s = [Setting("locale", lambda: locale.setlocale(locale.LC_ALL), lambda v: locale.setlocale(locale.LC_ALL, v)),
         Setting("timezone", lambda: (time.tzname, time.timezone, time.daylight), lambda _: time.tzset()),
         Setting("priority", lambda: os.getpriority(os.PRIO_PROCESS, 0),
                 lambda v: os.setpriority(os.PRIO_PROCESS, 0, v)),
         Setting("blocked signals", lambda: signal.pthread_sigmask(signal.SIG_BLOCK, []),
                 lambda v: signal.pthread_sigmask(signal.SIG_SETMASK, v))]
    if hasattr(os, "sched_getaffinity"):
        s.append(Setting("cpu affinity", lambda: os.sched_getaffinity(0), lambda v: os.sched_setaffinity(0, v)))
    for name in sorted(n for n in dir(resource) if n.startswith("RLIMIT_")):
        which = getattr(resource, name)
        s.append(Setting(f"rlimit {name}", lambda w=which: resource.getrlimit(w),
                         lambda v, w=which: resource.setrlimit(w, v)))
    return s


def _torch() -> list[Setting]:
    import torch

    s = [Setting("torch print options", lambda: dict(vars(torch._tensor_str.PRINT_OPTS)),
                 lambda v: torch.set_printoptions(**v)),
         Setting("torch autocast cache", torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled),
         Setting("torch warn always", torch.is_warn_always_enabled, torch.set_warn_always),
         Setting("torch deterministic debug mode", torch.get_deterministic_debug_mode,
                 torch.set_deterministic_debug_mode),
         Setting("torch interop threads", torch.get_num_interop_threads, None),
         Setting("torch sharing strategy", torch.multiprocessing.get_sharing_strategy,
                 torch.multiprocessing.set_sharing_strategy),
         Setting("torch mha fastpath", torch.backends.mha.get_fastpath_enabled,
                 torch.backends.mha.set_fastpath_enabled)]
    for device in DEVICE_TYPES:
        with contextlib.suppress(Exception):  # (a device type this torch does not know)
            torch.is_autocast_enabled(device)
            s.append(Setting(f"torch autocast {device}",
                             lambda d=device: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)),
                             lambda v, d=device: (torch.set_autocast_enabled(d, v[0]), torch.set_autocast_dtype(d, v[1]))))
    return s + _backend_properties(torch.backends)


def _backend_properties(backends: Any) -> list[Setting]:
    """Every setting a ``torch.backends`` module holds as a property (``mkldnn.enabled``, ``cudnn.benchmark``,
    ``quantized.engine``...), found by walking them: a new torch's new flags are in the census too."""
    found = []
    for name in sorted(n for n in dir(backends) if not n.startswith("_")):
        module = getattr(backends, name, None)
        for attr, descriptor in sorted(vars(type(module)).items()):
            if not attr.startswith("_") and hasattr(descriptor, "__get__") and hasattr(descriptor, "__set__"):
                found.append(Setting(f"torch.backends.{name}.{attr}", lambda m=module, a=attr: getattr(m, a),
                                     lambda v, m=module, a=attr: setattr(m, a, v)))
    return found


def _numpy() -> list[Setting]:
    import numpy as np

    return [Setting("numpy print options", np.get_printoptions, lambda v: np.set_printoptions(**v))]


def _loggers() -> Setting:
    """Each logger's level, propagation and disabled flag (a fresh process's where a call made the logger)."""

    def get() -> dict[str, tuple[int, bool, bool]]:
        loggers = {"": logging.root, **logging.Logger.manager.loggerDict}
        return {name: state for name, g in loggers.items() if isinstance(g, logging.Logger)
                and (state := (g.level, g.propagate, g.disabled)) != _FRESH_LOGGER and name != ""}

    def put(states: dict[str, tuple[int, bool, bool]]) -> None:
        for name, g in logging.Logger.manager.loggerDict.items():
            if isinstance(g, logging.Logger):
                g.level, g.propagate, g.disabled = states.get(name, _FRESH_LOGGER)
        logging.Logger.manager._clear_cache()

    return Setting("logger levels", get, put)
