"""Where a workflow's stage runs: one of the workflow's sites, its executor in the workflow's
Parsl config, and the file system its stages see.

A workflow has one site or several (``pt.workflow(sites=[default, *others])``;
a stage call's ``site=`` picks one). Every site whose stages Parsl starts from
here (local, PBS, Slurm) sees the files of the machine the workflow runs on
(``LOCAL_FILES``); a Globus Compute site sees its endpoint's, unless its site
file says which file system it shares (``globus.file_system``). A stage's
inputs must be on its site's file system: checked when it is called, before
anything is submitted (files are not moved between sites here).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import sites
from ...common import settings
from ...errors import ConfigError
from ...launch.plan import MAX_RANKS_PER_NODE
from ...launch.schedulers import Scheduler, get_scheduler
from ...sites.build import MPI_LABEL, executor_label

#: the file system of the machine the workflow runs on
LOCAL_FILES = "local"


@dataclass(frozen=True)
class Placement:
    """One site of a workflow: ``mpi_label`` is its MPI executor's label in the workflow's Parsl config;
    ``pool``: its blocks run parsl-torch's worker pool (``launch.pool``: lost nodes kept out, ``min_nodes``)."""

    site: sites.Site
    mpi_label: str
    pool: bool = False

    @property
    def scheduler(self) -> Scheduler:
        return get_scheduler(self.site.spec.scheduler)

    @property
    def remote(self) -> bool:
        """Its stages run through a Globus Compute endpoint."""
        return self.scheduler.remote

    @property
    def file_system(self) -> str:
        g = self.site.spec.globus
        if g is None:
            return LOCAL_FILES
        return g.file_system or f"endpoint {g.endpoint_id}"

    @property
    def ranks_per_node(self) -> int:
        return self.site.ranks_per_node

    def stage_dir(self, run_dir: Path, stage: str) -> Path:
        """Where a stage's files go: in the run directory, or on a Globus Compute site in the endpoint's
        ``remote_run_dir``/<run directory's name>/ (not made here)."""
        if self.remote:
            return Path(self.site.spec.globus.remote_run_dir) / run_dir.name / stage
        return run_dir / stage

    def check_resources(self, stage: str, num_nodes: int, ranks_per_node: int) -> None:
        spec = self.site.spec
        for name, value in (("num_nodes", num_nodes), ("ranks_per_node", ranks_per_node)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"stage {stage!r}: {name}={value!r} must be a positive int")
        if ranks_per_node > MAX_RANKS_PER_NODE:
            raise ConfigError(f"stage {stage!r}: ranks_per_node={ranks_per_node} is more than any node holds "
                              f"(at most {MAX_RANKS_PER_NODE})")
        if self.remote:
            return  # the endpoint's own configuration decides
        limit = self.scheduler.max_nodes_per_block or spec.provider.nodes_per_block - spec.mpi.spare_nodes
        if num_nodes > limit:
            spares = f", {spec.mpi.spare_nodes} of them spare (mpi.spare_nodes)" if spec.mpi.spare_nodes else ""
            where = "runs on this machine only" if self.scheduler.one_machine else (
                f"has blocks of {spec.provider.nodes_per_block} node(s) (provider.nodes_per_block{spares})")
            raise ConfigError(f"stage {stage!r}: num_nodes={num_nodes} but site {spec.name!r} {where}: "
                              f"ask for fewer nodes or raise the site's nodes (--nodes / {settings.NODES.name})")

    def check_min_nodes(self, stage: str, min_nodes: int | None, num_nodes: int) -> None:
        """``min_nodes``: an int from 1 to ``num_nodes``, on a site whose blocks parsl-torch starts."""
        if min_nodes is None:
            return
        if not isinstance(min_nodes, int) or isinstance(min_nodes, bool) or not 1 <= min_nodes <= num_nodes:
            raise ConfigError(f"stage {stage!r}: min_nodes={min_nodes!r} must be an int from 1 to num_nodes "
                              f"({num_nodes})")
        if self.remote or not self.pool:
            how = "runs through Globus Compute (the endpoint's workers place stages)" if self.remote else \
                "is in a Parsl config of your own (its blocks do not run parsl-torch-pool)"
            raise ConfigError(f"stage {stage!r}: min_nodes={min_nodes} needs blocks that pt.workflow starts, and "
                              f"site {self.site.name!r} {how}: leave min_nodes out")
        if min_nodes < num_nodes and self.scheduler.survive_node_loss_line \
                and not self.site.spec.provider.survive_node_loss:
            raise ConfigError(f"stage {stage!r}: min_nodes={min_nodes} goes on with the nodes its block has left, "
                              f"but {self.scheduler.name} ends a block's job when a node dies: set "
                              f"provider.survive_node_loss: true in site {self.site.name!r}'s file (or leave "
                              f"min_nodes out)")

    def check_inputs(self, stage: str, inputs: list[Any], made_on: dict[int, tuple[Any, str, Placement]]) -> None:
        """Each input reaches this site: a file given here must exist and this site must see the files
        here; a file another stage makes must be on a file system this site sees (``made_on``: a
        DataFuture's id -> (the DataFuture, the stage making it, its placement))."""
        for item in inputs:
            if isinstance(item, Future):  # another stage's output (a future of no stage's: not checked here)
                made = made_on.get(id(item))
                if made is not None and made[0] is item and made[2].file_system != self.file_system:
                    raise ConfigError(self._unreachable(stage, f"the output of stage {made[1]!r} on site "
                                                               f"{made[2].site.name!r}", made[2].file_system))
                continue
            check_file_name(stage, "input", item)
            path, scheme = getattr(item, "filepath", None), getattr(item, "scheme", "file")
            if path is None:
                continue
            if scheme != "file":
                raise ConfigError(f"stage {stage!r}: input {getattr(item, 'url', path)} is a {scheme}:// file: "
                                  f"stages read files on their site's file system; copy it there first")
            if self.file_system != LOCAL_FILES:
                raise ConfigError(self._unreachable(stage, f"input file {path} (a file where the workflow runs)",
                                                    LOCAL_FILES))
            if not Path(path).exists():
                raise ConfigError(f"stage {stage!r}: input file {path} does not exist")

    def _unreachable(self, stage: str, what: str, where: str) -> str:
        return (f"stage {stage!r} on site {self.site.name!r} cannot read {what}: it is on file system {where!r}, "
                f"and site {self.site.name!r} sees {self.file_system!r}. Run both stages on sites that share a "
                f"file system (a Globus Compute site's globus.file_system names the one it sees: 'local' for "
                f"the files where the workflow runs), or give the stage a copy on its own file system")


def placements(default: sites.Site, others: list[sites.Site], users_config: bool) -> dict[str, Placement]:
    """Each site of a workflow and its executor label: ``mpi`` for a workflow of one site, ``<site>.mpi``
    when several sites share the workflow's Parsl config, or in a Parsl config of the user's own."""
    prefixed = users_config or bool(others)
    return {s.name: Placement(s, executor_label(MPI_LABEL, s.name if prefixed else None), pool=not users_config)
            for s in (default, *others)}


def check_file_name(stage: str, role: str, file: Any) -> None:
    """A name that Parsl's ``File``, which reads it as a URL, would cut (``model#1.pt`` is ``model``: two
    outputs could become one file) or take for a scheme (``ckpt:3.pt``): refused, saying what it would be."""
    url, scheme = getattr(file, "url", None), getattr(file, "scheme", "file")
    if not isinstance(url, str):
        return
    if scheme == "file" and (mark := next((m for m in ";?#" if m in url), None)):
        raise ConfigError(f"stage {stage!r}: {role} {url!r}: Parsl reads a file's name as a URL, in which "
                          f"{mark!r} ends the path, so the file would be {file.filepath!r}: name it without ; ? #")
    if scheme != "file" and "://" not in url:
        raise ConfigError(f"stage {stage!r}: {role} {url!r}: Parsl reads '{scheme}:' as a URL's scheme: write "
                          f"'./{url}' for a file of that name")
