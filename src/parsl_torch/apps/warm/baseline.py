"""A warm rank's process as its group started it, and putting it back after each call (``rank``): the
process-wide state a new process starts with and a call may change, so the next call finds what a cold
stage's ranks find.

Module state is the call's own and stays (see ``apps.warm``); what cannot be undone from outside (a
thread still running) is reported, and the rank stops after the call.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

#: torch.backends flags a call may change: (module path, attribute)
_FLAGS = (("cuda.matmul", "allow_tf32"), ("cudnn", "allow_tf32"), ("cudnn", "benchmark"), ("cudnn", "deterministic"),
          ("cudnn", "enabled"), ("cuda.matmul", "allow_fp16_reduced_precision_reduction"),
          ("cuda.matmul", "allow_bf16_reduced_precision_reduction"))
#: the modules that hold an ``fp32_precision`` (torch >= 2.9): the same choices as ``set_float32_matmul_precision``
#: and the ``allow_tf32`` flags, held apart; mixing them leaves a process whose reads of either raise
_PRECISIONS = ("", "cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "mkldnn", "mkldnn.matmul", "mkldnn.conv",
               "mkldnn.rnn")
#: handlers a call may install (a SIGTERM handler that checkpoints): the next call gets the rank's own
_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")


class Baseline:
    """What a rank looked like when the group started: each call's changes are undone against it."""

    def __init__(self) -> None:
        import numpy as np
        import torch

        self.cwd, self.environ, self.path = os.getcwd(), dict(os.environ), list(sys.path)
        root = logging.getLogger()
        self.handlers, self.level = list(root.handlers), root.level
        self.warnings = list(warnings.filters)
        self.umask = os.umask(0o022)
        os.umask(self.umask)
        self.socket_timeout = socket.getdefaulttimeout()
        self.dtype = torch.get_default_dtype()
        self.grad = torch.is_grad_enabled()
        self.deterministic = (torch.are_deterministic_algorithms_enabled(),
                              torch.is_deterministic_algorithms_warn_only_enabled())
        self.flags = _backend_flags()
        self.switches = {name: get() for name, (get, _) in _switches().items()}
        self.numpy_errors = np.geterr()
        self.signals = {name: signal.getsignal(getattr(signal, name)) for name in _SIGNALS if hasattr(signal, name)}
        self.streams = (sys.stdin, sys.stdout, sys.stderr, sys.excepthook)
        self.recursion = sys.getrecursionlimit()
        self.devices = {kind: backend.current_device() for kind, backend in _accelerators()  # (setup_torch's)
                        if getattr(backend, "is_initialized", lambda: False)()}
        self.threads = set(threading.enumerate())
        self.added: list[tuple[logging.Logger, logging.Handler]] = []  # by the calls' own code
        _note_added_handlers(self.added)

    def restore(self, stage_dir: str) -> None:
        """Put the process back after a call that ran in ``stage_dir``."""
        import numpy as np
        import torch

        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.environ)
        sys.path[:] = self.path
        sys.stdin, sys.stdout, sys.stderr, sys.excepthook = self.streams  # (a call's own file for prints)
        sys.setrecursionlimit(self.recursion)
        self._tidy_loggers(stage_dir)
        root = logging.getLogger()
        root.handlers[:] = self.handlers
        root.setLevel(self.level)
        warnings.filters[:] = self.warnings
        os.umask(self.umask)
        socket.setdefaulttimeout(self.socket_timeout)
        torch.set_grad_enabled(self.grad)
        now = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
        if now != self.deterministic:  # (only then: the call imports inductor, 1 s)
            torch.use_deterministic_algorithms(self.deterministic[0], warn_only=self.deterministic[1])
        _set_backend_flags(self.flags)
        for name, (get, put) in _switches().items():
            if name in self.switches and get() != self.switches[name]:
                put(self.switches[name])
        np.seterr(**self.numpy_errors)
        signal.alarm(0)  # (an alarm the call set would reach the next one)
        for name, handler in self.signals.items():
            if handler is not None:  # (None: installed from outside Python, left as it is)
                signal.signal(getattr(signal, name), handler)
        torch.seed()  # fresh entropy, as a new process's torch, random and numpy have
        random.seed()
        np.random.seed()
        torch.set_default_dtype(self.dtype)
        torch.set_default_device(None)
        for kind, backend in _accelerators():
            if kind in self.devices:
                backend.set_device(self.devices[kind])
            backend.empty_cache()

    def _tidy_loggers(self, stage_dir: str) -> None:
        """The loggers as the call's process would have left them at its exit: the handlers the call's code
        added are taken off and its log files closed (``logger.addHandler(StreamHandler())`` in the stage's
        function would otherwise print each line once more per call), and so are the log files in its stage's
        directory that a module opened as the call imported it (a later call's lines never reach an earlier
        stage's files); root's handlers are all the call's."""
        for logger, handler in self.added:
            _take_off(logger, handler)
        self.added.clear()
        inside = os.path.join(os.path.realpath(stage_dir), "")
        root = logging.getLogger()
        for logger in [root, *(g for g in logging.Logger.manager.loggerDict.values() if isinstance(g, logging.Logger))]:
            for handler in list(logger.handlers):
                if handler not in self.handlers and (logger is root or isinstance(handler, logging.FileHandler) and
                                                     os.path.realpath(handler.baseFilename).startswith(inside)):
                    _take_off(logger, handler)

    def threads_left(self) -> list[str]:
        """Threads the calls started that still run (nothing can stop them from outside)."""
        return [t.name for t in threading.enumerate() if t not in self.threads and t.is_alive()]


def _note_added_handlers(added: list[tuple[logging.Logger, logging.Handler]]) -> None:
    """From now on, each handler this process's code adds to a logger outside an import is noted in
    ``added`` (one a module adds as it is imported is the module's state, and stays; parsl-torch's own
    rank-aware handlers are added again where they are missing)."""
    add = logging.Logger.addHandler

    def add_handler(logger: logging.Logger, handler: logging.Handler) -> None:
        add(logger, handler)
        if not getattr(handler, "_parsl_torch", False) and not importing():
            added.append((logger, handler))

    logging.Logger.addHandler = add_handler  # type: ignore[method-assign]


def importing() -> bool:
    """A module is being imported: importlib's frames are on the stack (above the caller of the function
    that asks)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _take_off(logger: logging.Logger, handler: logging.Handler) -> None:
    logger.removeHandler(handler)
    if isinstance(handler, logging.FileHandler):  # (a stream handler's stream is not its own: left open)
        with contextlib.suppress(Exception):
            handler.close()


def _accelerators() -> list[tuple[str, Any]]:
    """torch's modules of the accelerators this process has: ("cuda", torch.cuda), ("xpu", torch.xpu)."""
    import torch

    return [(kind, backend) for kind in ("cuda", "xpu")
            if (backend := getattr(torch, kind, None)) is not None and backend.is_available()]


def _switches() -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]:
    """torch's process-wide settings that have a getter and a setter: (get, set) by name, those this
    torch has."""
    import torch

    cuda = torch.backends.cuda
    switches: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
        "threads": (torch.get_num_threads, torch.set_num_threads),
        "anomaly": (lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
                    lambda value: torch.autograd.set_detect_anomaly(*value)),
    }
    for kind in ("flash", "mem_efficient", "math", "cudnn"):  # scaled_dot_product_attention's kernels
        get, put = getattr(cuda, f"{kind}_sdp_enabled", None), getattr(cuda, f"enable_{kind}_sdp", None)
        if get is not None and put is not None:
            switches[f"{kind} sdp"] = (get, put)
    return switches


def _flag_owner(where: str) -> Any:
    """The torch.backends module that holds a flag (``"cuda.matmul"``: torch.backends.cuda.matmul)."""
    import torch

    module = torch.backends
    for part in filter(None, where.split(".")):
        module = getattr(module, part)
    return module


def _backend_flags() -> dict[tuple[str, str], Any]:
    """The flags as a cold process has them: the matmul precision and the legacy switches, then each
    ``fp32_precision`` (a call that sets one with the other API leaves the legacy reads raising)."""
    import torch

    flags: dict[tuple[str, str], Any] = {("", "float32_matmul_precision"): torch.get_float32_matmul_precision()}
    for where, name in _FLAGS:
        with contextlib.suppress(AttributeError):  # (a flag this torch does not have)
            flags[(where, name)] = getattr(_flag_owner(where), name)
    for where in _PRECISIONS:
        with contextlib.suppress(AttributeError):  # (torch < 2.9, or a build without that backend)
            flags[(where, "fp32_precision")] = _flag_owner(where).fp32_precision
    return flags


def _set_backend_flags(flags: dict[tuple[str, str], Any]) -> None:
    """Set in the order they were read: the legacy switches first, then the new API's settings, the one
    order that gives back the cold state exactly (reads of both work again)."""
    import torch

    for (where, name), value in flags.items():
        if name == "float32_matmul_precision":
            torch.set_float32_matmul_precision(value)
        else:
            setattr(_flag_owner(where), name, value)
