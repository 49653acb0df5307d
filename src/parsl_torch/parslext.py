"""Where parsl-torch reaches into Parsl's private parts: every patch, and every private name it relies on,
listed once (``PATCHES``), each checked against the installed Parsl (``check``) when a workflow starts
and by ``parsl-torch doctor``, so that a Parsl release that moved one is named at start, with the fix,
not met as a task that never ends. The manual's list is generated from it (docs/architecture.md).

Parsl's public extension points (a ``memoizer=``, ``id_for_memo``, executor and scheduler subclasses, a
``launch_cmd``, providers and launchers) are used as they are and are not listed here. Layer 0: Parsl is
imported only inside ``check``.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError


@dataclass(frozen=True)
class Patch:
    """One reach into Parsl: ``target`` (``module:attribute``), what parsl-torch does there (``how``, in
    ``where``), why no public way serves, and ``holds``, whether the installed Parsl still has it."""

    name: str
    target: str
    where: str
    how: str
    why: str
    holds: Callable[[object], bool]


def _has(name: str) -> Callable[[object], bool]:
    return lambda obj: hasattr(obj, name)


def _sets(name: str) -> Callable[[object], bool]:
    """A class whose ``__init__`` sets the attribute ``name`` on its objects."""
    return lambda cls: name in cls.__init__.__code__.co_names  # type: ignore[misc]


def _reads_tasks(cls: object) -> bool:
    """The executor's ``tasks`` property is its private ``_tasks`` dict (the result thread pops it)."""
    prop = getattr(cls, "tasks", None)
    return isinstance(prop, property) and "_tasks" in prop.fget.__code__.co_names


def _imports_scheduler(package: object) -> bool:
    """The worker pool's module imports ``MPITaskScheduler`` by name from its module when it runs (read, not
    imported: the pool's module is heavy)."""
    tree = ast.parse((Path(package.__path__[0]) / "process_worker_pool.py").read_text())  # type: ignore[attr-defined]
    return any(isinstance(node, ast.ImportFrom) and (node.module or "").endswith("mpi_resource_management")
               and any(alias.name == "MPITaskScheduler" for alias in node.names) for node in ast.walk(tree))


PATCHES: tuple[Patch, ...] = (
    Patch("the executors' task table",
          "parsl.executors.high_throughput.executor:HighThroughputExecutor", "sites/executors.SettlesEarly",
          "replaces `_tasks` with a dict that lets a task be ended from its supervisor's outcome",
          "a scheduler that ends the whole job for one lost node ends Parsl's worker before it answers; Parsl "
          "would fail the task only when the manager's heartbeat runs out, minutes later", _reads_tasks),
    Patch("the worker pool's MPI scheduler",
          "parsl.executors.high_throughput:", "launch/pool._place_with_slots",
          "sets `mpi_resource_management.MPITaskScheduler` to parsl-torch's subclass before the pool runs",
          "the pool names the class it instantiates: only a subclass keeps lost nodes out, holds spares and "
          "places stages on a shared node's accelerators", _imports_scheduler),
    Patch("a provider's submission",
          "parsl.providers.cluster_provider:ClusterProvider", "sites/build.render",
          "replaces `execute_wait` on one provider object while it renders a batch script",
          "Parsl writes a block's script only on its way to submitting it; `sites render` must not submit",
          _has("execute_wait")),
    Patch("typeguard's checks of Parsl",
          "typeguard:", "launch/leanparsl._unchecked",
          "makes `typechecked` return what it decorates while Parsl's processes import Parsl",
          "typeguard compiles each checked module again at import (0.15 s of the forkserver's 0.5 s of CPU) to "
          "check arguments Parsl passes itself", _has("typechecked")),
    Patch("Parsl's heavy package imports",
          "parsl:", "launch/leanparsl._hollow",
          "puts `parsl` and `parsl.executors` in `sys.modules` without running their `__init__`",
          "their `__init__` imports every executor and the monitoring database (0.9 s of CPU) in the interchange "
          "and the pool, which need a tenth of it", _has("__path__")),
    Patch("a task's record",
          "parsl.dataflow.futures:AppFuture", "apps/stage/futures.StageFuture.from_cache, apps/stage/settle",
          "reads `task_record` (its `from_memo`, its try's future)",
          "Parsl says whether a task came from its memo table only there", _sets("task_record")),
)


#: those a block's worker pool relies on, checked there too (its Python may not be the workflow's)
IN_THE_POOL = tuple(p for p in PATCHES if p.where.startswith("launch/"))


def check(patches: tuple[Patch, ...] = PATCHES) -> None:
    """Each patch's target as parsl-torch expects it in the installed Parsl, or one ConfigError naming them."""
    broken = []
    for patch in patches:
        module, _, attribute = patch.target.partition(":")
        try:
            found: object = importlib.import_module(module)
            for part in filter(None, attribute.split(".")):
                found = getattr(found, part)
            holds = patch.holds(found)
        except (ImportError, AttributeError, OSError, TypeError):
            holds = False
        if not holds:
            broken.append(f"{patch.name} ({patch.target}, used by {patch.where})")
    if broken:
        import parsl

        raise ConfigError(f"Parsl {parsl.__version__} is not the Parsl parsl-torch reaches into: "
                          f"{'; '.join(broken)} moved or changed. Install the Parsl version pyproject.toml names "
                          f"(pip install -e . in parsl-torch's folder)")


def markdown_table(patches: tuple[Patch, ...] = PATCHES) -> str:
    """The manual's list (docs/hooks.py)."""
    rows = [f"| {p.name} | `{p.target.rstrip(':')}` | `{p.where}` {p.how} | {p.why} |" for p in patches]
    return "\n".join(["| what | Parsl's | what parsl-torch does | why no public way serves |", "|---|---|---|---|",
                      *rows])
