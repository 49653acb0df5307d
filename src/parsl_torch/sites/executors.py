"""The site's executor classes: Parsl's MPIExecutor and HighThroughputExecutor, each of which hands
the other the apps Parsl gives the wrong one (Parsl sends an app without ``executors=`` to any
executor of the config, so a site's config runs a Parsl user's apps as Parsl's own MPI config
would), and a resource specification completed before Parsl checks it. Imports Parsl: ``build``
loads it when it makes a site's executors."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from parsl.executors import HighThroughputExecutor, MPIExecutor
from parsl.executors.errors import InvalidResourceSpecification

from ..errors import ConfigError
from ..launch.packing import MIN_NODES_KEY

#: the keys of a resource specification that HighThroughputExecutor takes; any other asks for MPI ranks
HTEX_RESOURCE_KEYS = frozenset({"priority"})


class _Tasks(dict):
    """HTEX's table of the tasks it waits on (task id -> future), from which its result thread takes
    each task as its answer arrives: a task settled early (``SettlesEarly.settle``) is gone from it, and
    the interchange's later word on it (ManagerLost, minutes later) goes to a future nobody holds
    instead of ending that thread with a KeyError."""

    def __init__(self, tasks: dict) -> None:
        super().__init__(tasks)
        self.settled: set[Any] = set()

    def pop(self, key: Any, *default: Any) -> Any:
        if key in self.settled:
            self.settled.discard(key)  # (its one later word has come: nothing is kept for it any longer)
            if key not in self:
                return Future()
        return super().pop(key, *default)


class SettlesEarly:
    """An executor whose task can be ended with what its stage's supervisor recorded
    (``apps.stage.settle``), when Parsl's own answer cannot come: a scheduler that ends the whole batch job
    for one lost node ends Parsl's worker with it, and the task would wait for the manager's heartbeat
    to run out."""

    def _settling(self) -> None:
        """Parsl's task table (``_tasks``, private: a dict its result thread pops) replaced by ours, checked
        first: a Parsl that keeps its tasks elsewhere is named at start, not a task that never ends."""
        tasks = getattr(self, "_tasks", None)
        if not isinstance(tasks, dict):
            import parsl

            raise ConfigError(f"Parsl {parsl.__version__}'s {type(self).__mro__[2].__name__} keeps no task table "
                              f"(`_tasks`, a dict) for parsl-torch to end a lost node's tasks in: install the Parsl "
                              f"version pyproject.toml names (pip install -e .)")
        if not isinstance(tasks, _Tasks):
            self._tasks = _Tasks(tasks)

    def settle(self, future: Future, exc: BaseException) -> bool:
        """End ``future`` (one this executor returned) with ``exc``; False if its answer came first."""
        tid = getattr(future, "parsl_executor_task_id", None)
        if tid is None or not isinstance(self._tasks, _Tasks):
            return False
        self._tasks.settled.add(tid)  # (first: the result thread may take it meanwhile)
        if dict.pop(self._tasks, tid, None) is not future:
            return False
        future.set_exception(exc)
        return True


class SiteMPIExecutor(SettlesEarly, MPIExecutor):
    """An ordinary app (no resource specification), which a plain MPIExecutor fails, goes to the
    site's single-process executor when there is one, else runs as one process on one node."""

    single_process: Any = None

    def start(self):
        self._settling()
        return super().start()

    def submit(self, func, resource_specification, *args, **kwargs):
        if not resource_specification:
            if self.single_process is not None:
                return self.single_process.submit(func, resource_specification, *args, **kwargs)
            resource_specification = {"num_nodes": 1, "ranks_per_node": 1, "num_ranks": 1}
        return super().submit(func, resource_specification, *args, **kwargs)

    def validate_resource_spec(self, resource_specification):
        """Parsl's own check, on the specification itself: it completes it in place (``num_ranks``
        from ``num_nodes`` x ``ranks_per_node``, which ``PARSL_NUM_RANKS`` and the launch prefixes
        are made from); a stage's min_nodes, which parsl-torch-pool reads (``launch.pool``) and
        Parsl does not know, is set aside meanwhile."""
        min_nodes = resource_specification.pop(MIN_NODES_KEY, None)
        try:
            complete_mpi_spec(resource_specification)
            return super().validate_resource_spec(resource_specification)
        finally:
            if min_nodes is not None:
                resource_specification[MIN_NODES_KEY] = min_nodes


class SiteHighThroughputExecutor(SettlesEarly, HighThroughputExecutor):
    """An MPI app (a resource specification with ranks), which a plain HighThroughputExecutor
    refuses (InvalidResourceSpecification), goes to the site's MPI executor. Its interchange (a
    process that imports Parsl: 1.5 to 2 s of CPU) starts with the first app it runs, not with the
    workflow: most workflows run only multi-rank stages, and its blocks start on demand anyway."""

    multi_process: Any = None

    def start(self):
        self._starting = threading.Lock()
        self._started = False

    def _start_once(self) -> None:
        with self._starting:
            if not self._started:
                self._settling()
                super().start()
                self._started = True

    def submit(self, func, resource_specification, *args, **kwargs):
        if self.multi_process is not None and set(resource_specification or ()) - HTEX_RESOURCE_KEYS:
            return self.multi_process.submit(func, resource_specification, *args, **kwargs)
        self._start_once()
        return super().submit(func, resource_specification, *args, **kwargs)

    def status(self):
        """Before its start it has no blocks, and no interchange to ask which are connected."""
        return super().status() if self._started else {}

    def scale_in(self, blocks, max_idletime=None):
        return super().scale_in(blocks, max_idletime) if self._started else []


def complete_mpi_spec(resources: dict[str, Any]) -> None:
    """``num_ranks`` or ``ranks_per_node`` from the other two, in place and as integers (Parsl divides
    ``num_ranks / num_nodes`` into ``2.0``, which becomes ``-ppn 2.0``); ranks that do not divide
    evenly over the nodes get the ranks per node rounded up (4 over 3 nodes: 2, 2 and 0, as
    ``parsl-torch launch`` places them)."""
    nodes, ppn, ranks = (resources.get(k) for k in ("num_nodes", "ranks_per_node", "num_ranks"))
    try:
        if nodes and ppn and not ranks:
            resources["num_ranks"] = int(nodes) * int(ppn)
        elif nodes and ranks and not ppn:
            resources["ranks_per_node"] = -(-int(ranks) // int(nodes))
    except (TypeError, ValueError):
        raise InvalidResourceSpecification({"num_nodes", "ranks_per_node", "num_ranks"},
                                           f"num_nodes, ranks_per_node and num_ranks must be integers: "
                                           f"{resources}") from None
