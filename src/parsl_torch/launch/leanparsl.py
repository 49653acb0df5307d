"""Parsl's modules imported without what Parsl's processes of a block never use.

``import parsl`` runs ``parsl/__init__.py`` and ``parsl/executors/__init__.py``, which import
every executor (Flux, Work Queue, Globus Compute: globus-compute-sdk, when the ``endpoint`` extra
installed it), the data flow kernel and the monitoring database (SQLAlchemy): about 0.9 s of CPU,
in each of the three processes a workflow starts before its first stage runs (the interchange,
the worker pool, the pool's forkserver), which need a tenth of it.

Here the optional packages are blocked (Parsl takes them as absent) while the modules asked for
are imported (the interchange and the pool run whole inside the block), and for these two, those
two packages are put in ``sys.modules`` hollow (their ``__init__`` not run): 0.3 s of CPU instead
of 0.9 for the interchange's module. A hollow package is filled (its ``__init__`` run) the first
time it is asked for anything that is not one of its modules: code that uses ``parsl.File`` or
``from parsl import python_app`` gets Parsl whole. The pool's forkserver imports Parsl whole (its
workers unpickle Parsl's bash app, which imports the data flow kernel and every executor), once for
all of them.

In all three, Parsl's ``@typechecked`` functions are left as written: typeguard instruments each at its
import by parsing and compiling the whole of its module's source again (0.15 s of the forkserver's 0.5 s
of CPU), to check arguments that these processes get from Parsl itself. So are they in a workflow's own
process (``parsl_for_a_workflow``: Parsl whole there), where nothing imported Parsl before.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from typing import Any

from ..common.gcpause import paused_gc

#: what Parsl imports if it can (``try: import ... except ImportError``), for executors and a
#: monitoring database that run in the workflow's process, never in these
UNUSED = ("globus_compute_sdk", "sqlalchemy")
#: packages whose ``__init__`` imports far more than their modules need
HOLLOW = ("parsl", "parsl.executors")


@contextlib.contextmanager
def lean_imports(hollow: bool = True) -> Iterator[None]:
    """While inside: UNUSED blocked (then unblocked: a task this process runs later may still import
    them) and, with ``hollow``, HOLLOW hollow where not imported yet. The interchange and the pool's own
    process (which run no task: the pool's workers are forked from its forkserver) run inside it."""
    blocked = [m for m in UNUSED if m not in sys.modules]
    sys.modules.update(dict.fromkeys(blocked))
    try:
        for package in HOLLOW if hollow else ():
            if package not in sys.modules:
                _hollow(package)
        with _unchecked():
            yield
    finally:
        for m in blocked:
            if m in sys.modules and sys.modules[m] is None:
                del sys.modules[m]


def parsl_for_a_workflow() -> None:
    """Parsl imported whole in a workflow's process, where nothing imported it yet: with the garbage collector
    paused (``common.gcpause``) and typeguard's instrumenting of Parsl's functions left out (0.3 s of the
    import's 1 s of CPU): the Parsl objects a workflow makes are parsl-torch's, from checked site files. A
    script that imports Parsl itself first gets it as it is."""
    if "parsl" in sys.modules:
        return
    with paused_gc(), _unchecked():
        for name in ("parsl", "parsl.providers", "parsl.utils", "parsl.addresses"):
            importlib.import_module(name)


@contextlib.contextmanager
def _unchecked() -> Iterator[None]:
    """typeguard's ``typechecked`` returns what it decorates while inside (then it is itself again)."""
    try:
        import typeguard
    except ImportError:  # (Parsl requires it; without it there is nothing to leave out)
        yield
        return
    checked = typeguard.typechecked

    def as_written(target: Any = None, **_options: Any) -> Any:
        return (lambda decorated: decorated) if target is None else target

    typeguard.typechecked = as_written  # type: ignore[assignment]
    try:
        yield
    finally:
        typeguard.typechecked = checked


def import_lean(*names: str, hollow: bool = True) -> None:
    """Modules ``names`` imported inside ``lean_imports(hollow)``."""
    with lean_imports(hollow):
        for name in names:
            importlib.import_module(name)


def _hollow(name: str) -> None:
    """``name`` in sys.modules with its ``__path__`` (its modules import) but not its ``__init__`` run."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    package = importlib.util.module_from_spec(spec)

    def fill_then_get(attribute: str) -> Any:
        if importlib.util.find_spec(f"{name}.{attribute}") is not None:  # one of its modules: no need
            return importlib.import_module(f"{name}.{attribute}")
        del package.__getattr__
        spec.loader.exec_module(package)  # type: ignore[union-attr]  # (checked above)
        return getattr(package, attribute)

    package.__getattr__ = fill_then_get  # type: ignore[method-assign]  # PEP 562: a module's own __getattr__
    sys.modules[name] = package
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, package)
