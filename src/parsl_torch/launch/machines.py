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

from ..common import settings
from ..errors import ConfigError

#: ALCF's binding for 12 ranks per Aurora node, one per GPU tile (8 cores each, skipping 0 and 52).
#: Source: ALCF "Running jobs on Aurora" (argonne-lcf/user-guides docs/aurora/running-jobs-aurora.md):
#: --cpu-bind=list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100
AURORA_CPU_BIND = "list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100"
#: the cores ALCF's lists use on each Aurora socket (cores 0 and 52 are reserved for system services)
_AURORA_SOCKETS = ((1, 48), (53, 100))


def aurora_cpu_list(ppn: int) -> str:
    """Per-socket CPU lists for ``ppn`` ranks: half the ranks on each socket, each a block of that
    socket's cores. ALCF: "explicit list binding ... is needed here to avoid binding a MPI rank to a
    logical core on different socket than the GPU ... (as would happen if cpu_bind=depth was used)".
    12 ranks gives ALCF's 12-rank list, 6 ranks its 6-rank list (list:1-16:17-32:33-48:53-68:69-84:85-100)."""
    per_socket = (-(-ppn // 2), ppn // 2)
    blocks = []
    for (first, last), ranks in zip(_AURORA_SOCKETS, per_socket):
        size = (last - first + 1) // ranks if ranks else 0
        blocks += [f"{first + i * size}-{first + (i + 1) * size - 1}" for i in range(ranks)]
    return "list:" + ":".join(blocks)


def _aurora(ppn: int) -> list[str]:
    # --pmi=pmix: ALCF's PyTorch page launches with "mpiexec --pmi=pmix --envall", and oneCCL's
    # CCL_PROCESS_LAUNCHER=pmix (the site file's environment) needs that PMI
    return ["--pmi=pmix", "--cpu-bind", aurora_cpu_list(ppn)]


def _polaris(ppn: int) -> list[str]:
    # ALCF "Using GPUs on Polaris" (docs/polaris/running-jobs/using-gpus.md): --depth=${NDEPTH} --cpu-bind depth
    return ["--depth", str(max(1, 32 // ppn)), "--cpu-bind", "depth"]


def _frontier(ppn: int) -> list[str]:
    # OLCF Frontier user guide (systems/frontier_user_guide.rst): "srun -N1 -n8 -c7 --gpus-per-task=1
    # --gpu-bind=closest", 7 cores "due to core specialization" (-S 8), the GCD closest to them
    return ["--cpus-per-task", "7", "--gpus-per-task", "1", "--gpu-bind", "closest"]


#: the cores of each of Aurora's 12 tiles: ALCF's 12-rank list, rank r on tile r
_AURORA_TILES = tuple(aurora_cpu_list(12).removeprefix("list:").split(":"))
#: the cores of Polaris's GPUs 0-3: with 4 ranks and depth 8, rank r has cores 8r..8r+7 and GPU 3 - r
_POLARIS_GPUS = ("24-31", "16-23", "8-15", "0-7")


@dataclass(frozen=True)
class Machine:
    name: str
    accelerators_per_node: int  # the default ranks per node
    device: str  # cuda | xpu
    binding: Callable[[int], list[str]] = lambda ppn: []  # ranks per node -> the launcher's binding flags
    #: accelerator of local rank r: gpu_order[r % len] (empty: r % count), for NUMA layouts where
    #: the cores ``binding`` gives rank r are closest to another GPU than r
    gpu_order: tuple[int, ...] = ()
    #: the variable that narrows the accelerators a process sees (a stage that shares a node)
    visibility: str = "CUDA_VISIBLE_DEVICES"
    #: the cores that go with each accelerator, in the accelerators' order (a list binding's blocks)
    cpu_blocks: tuple[str, ...] = ()

    def rank_env(self) -> dict[str, str]:
        """What every rank on this machine needs in its environment from the launch."""
        return {settings.GPU_ORDER.name: ",".join(map(str, self.gpu_order))} if self.gpu_order else {}

    def binding_args(self, ranks_per_node: int) -> list[str]:
        """The launcher flags that bind ``ranks_per_node`` ranks to CPUs and accelerators."""
        return self.binding(ranks_per_node)

    def shared_binding(self, positions: tuple[int, ...]) -> list[str] | None:
        """The binding flags for a stage that holds only the node's accelerators at ``positions``
        (one rank each): its accelerators' cores as a list (``--depth`` dropped); None when this
        machine's binding does not say which cores go with which accelerator."""
        flags = self.binding_args(len(positions))
        if not self.cpu_blocks or "--cpu-bind" not in flags:
            return None
        if "--depth" in flags:
            del flags[flags.index("--depth"):flags.index("--depth") + 2]
        flags[flags.index("--cpu-bind") + 1] = "list:" + ":".join(self.cpu_blocks[p] for p in positions)
        return flags


MACHINES: dict[str, Machine] = {m.name: m for m in (
    Machine("aurora", 12, "xpu", _aurora, visibility="ZE_AFFINITY_MASK", cpu_blocks=_AURORA_TILES),
    # Aurora's test system, the same node
    Machine("sunspot", 12, "xpu", _aurora, visibility="ZE_AFFINITY_MASK", cpu_blocks=_AURORA_TILES),
    # ALCF's set_affinity_gpu_polaris.sh: gpu=$((num_gpus - 1 - PMI_LOCAL_RANK % num_gpus)), "need to
    # assign GPUs in reverse order due to topology": with --cpu-bind depth local rank 0 has cores 0-7,
    # closest to GPU 3 (the same page's list: GPU 3 <-> cores 0-7, ..., GPU 0 <-> cores 24-31)
    Machine("polaris", 4, "cuda", _polaris, gpu_order=(3, 2, 1, 0), cpu_blocks=_POLARIS_GPUS),
    # torch's ROCm build calls its devices cuda; CUDA_VISIBLE_DEVICES would index ROCR's narrowed list
    Machine("frontier", 8, "cuda", _frontier, visibility="ROCR_VISIBLE_DEVICES"),
    Machine("perlmutter", 4, "cuda"),
)}


def get_machine(name: str | None) -> Machine | None:
    """The machine called ``name`` (None for none); a ConfigError for an unknown name."""
    if name is None:
        return None
    if name not in MACHINES:
        raise ConfigError(f"machine {name!r} is unknown: use one of {', '.join(MACHINES)}")
    return MACHINES[name]
