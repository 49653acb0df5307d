"""One stage call, as one record from the workflow script to the ranks.

``DistributedApp`` makes a ``StageCall`` once, when the stage is called; it is the first
argument of whichever Parsl app runs the call (cold: ``stagecmd.stage_command``; warm:
``warm.groups.WarmGroups``' app; remote: inside ``remote.job.RemoteJob``), and every reader takes
what it needs from it: the memoizer its identity (``memo``; the verdict leaves it in the stage
directory, where each attempt reads it), the worker the stage directory and command
(``stage.cold``), a warm group its shape, the endpoint its options. The call's own
arguments travel beside it as the app's arguments, so that Parsl resolves the futures among
them before any of this runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .options import ShippedFunction, StageOptions


@dataclass(frozen=True)
class StageCall:
    """A stage's function (or script command line), how it runs, and where."""

    opts: StageOptions
    executor: str  # the label of the site's MPI executor (on a remote site: its endpoint's)
    #: Parsl's resource specification: num_nodes, ranks_per_node, num_ranks (and the pool's min_nodes)
    resources: tuple[tuple[str, int], ...]
    fn: ShippedFunction | None = None  # None: a script stage
    script: tuple[str, ...] = ()  # a script stage's command line: ``python FILE ...`` or ``python -m MODULE ...``
    #: a fixed identity (a warm group's own serving call); None: the call's verdict leaves it in the stage
    #: directory (``identity.verdict``), where its attempt reads it
    id: str | None = None
    #: in your own Parsl config no verdict of ours precedes an attempt: the worker identifies the call itself
    identify_on_worker: bool = False

    @property
    def stage(self) -> str:
        return Path(self.opts.stage_dir).name

    @property
    def name(self) -> str:
        """What runs: the function's name, else the script's (or module's)."""
        if self.fn is not None:
            return self.fn.name.rsplit(".", 1)[-1]
        return Path(self.opts.script or self.opts.module or "").name

    @property
    def returns(self) -> bool:
        """A function stage: its rank 0 leaves a return value (or the stage failed)."""
        return self.fn is not None

    @property
    def resource_specification(self) -> dict[str, int]:
        """``resources`` as Parsl takes them."""
        return dict(self.resources)

    @staticmethod
    def of_task(task: Any) -> StageCall | None:
        """The call a Parsl task runs, if it is a stage's (a stage app's first argument is its call)."""
        args = task["args"]
        return args[0] if args and isinstance(args[0], StageCall) else None
