"""What a site's blocks hold at once: each node's accelerators, and so how many stages a block runs
together (``launch.packing`` places them)."""

from __future__ import annotations

from collections.abc import Mapping

from ..launch.accelerators import visible_ids
from ..launch.machines import get_machine
from ..launch.schedulers import get_scheduler
from .schema import SiteSpec


def node_accelerators(spec: SiteSpec, env: Mapping[str, str] | None = None) -> tuple[tuple[str, ...], str]:
    """Each node's accelerator ids and the variable that narrows them: ``launch.accelerators``, else the
    machine record's count, else, where the site's node is this host (local), the ones it sees."""
    machine = get_machine(spec.machine)
    variable = machine.visibility if machine else "CUDA_VISIBLE_DEVICES"
    if spec.launch.accelerators:
        return spec.launch.accelerators, variable
    if machine:
        return tuple(map(str, range(machine.accelerators_per_node))), variable
    if get_scheduler(spec.scheduler).one_machine:
        return visible_ids(env)
    return (), variable


def stages_at_once(spec: SiteSpec, shared: bool = True) -> int:
    """The MPI stages a block may run at once (its workers): the site's setting (``local_slots`` on the
    local site), or as many as its nodes have accelerators where stages share nodes (``shared``:
    the block runs parsl-torch's pool, which places them)."""
    local = get_scheduler(spec.scheduler).one_machine
    configured = spec.local_slots if local else spec.mpi.max_workers_per_block
    ids, _ = node_accelerators(spec)
    if not shared or not ids:
        return configured
    return max(configured, len(ids) * (1 if local else spec.provider.nodes_per_block))
