"""One record per machine: what a launch on it needs to know by default.

A machine is the hardware behind a site: accelerators per node (the default
ranks per node), the device kind, and the launcher flags that bind each rank
to its CPUs and accelerator. Which machine this host is comes from the site
files (``machine:`` in the file whose ``hostnames`` match) or from
``PARSL_TORCH_MACHINE``; hostname patterns live only in the site files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError

#: ALCF's binding for 12 ranks per Aurora node, one per GPU tile (8 cores each, skipping 0 and 52)
AURORA_CPU_BIND = "list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100"


def _aurora(ppn: int) -> list[str]:
    # ALCF's list for one rank per tile; else spread the 104 usable cores evenly
    return ["--cpu-bind", AURORA_CPU_BIND] if ppn == 12 else ["--depth", str(104 // ppn), "--cpu-bind", "depth"]


def _polaris(ppn: int) -> list[str]:
    return ["--depth", str(max(1, 32 // ppn)), "--cpu-bind", "depth"]


def _frontier(ppn: int) -> list[str]:
    # 8 GCDs, 56 usable cores: 7 per rank, the GPU closest to them
    return ["--cpus-per-task", "7", "--gpus-per-task", "1", "--gpu-bind", "closest"]


def _no_binding(ppn: int) -> list[str]:
    return []


@dataclass(frozen=True)
class Machine:
    name: str
    accelerators_per_node: int  # the default ranks per node
    device: str  # cuda | xpu
    binding: Callable[[int], list[str]] = _no_binding  # ranks per node -> the launcher's binding flags

    def binding_args(self, ranks_per_node: int) -> list[str]:
        """The launcher flags that bind ``ranks_per_node`` ranks to CPUs and accelerators."""
        return self.binding(ranks_per_node)


MACHINES: dict[str, Machine] = {m.name: m for m in (
    Machine("aurora", 12, "xpu", _aurora),
    Machine("sunspot", 12, "xpu", _aurora),  # Aurora's test system, the same node
    Machine("polaris", 4, "cuda", _polaris),
    Machine("frontier", 8, "cuda", _frontier),  # torch's ROCm build calls its devices cuda
    Machine("perlmutter", 4, "cuda"),
)}


def get_machine(name: str | None) -> Machine | None:
    """The machine called ``name`` (None for none); a ConfigError for an unknown name."""
    if name is None:
        return None
    if name not in MACHINES:
        raise ConfigError(f"machine {name!r} is unknown: use one of {', '.join(MACHINES)}")
    return MACHINES[name]


def binding_args(machine: str | None, ranks_per_node: int) -> list[str]:
    """The named machine's binding flags (none for no machine)."""
    m = get_machine(machine)
    return m.binding_args(ranks_per_node) if m else []
