"""One record of the parallel dimensions, checked identically on every rank before any collective.

A ``Layout`` gives each of the five dimensions its size (``dp_replicate``: whole replicas, as
DDP; ``dp_shard``: FSDP2 shards, -1 for the ranks the others leave; ``tp``: tensor parallel;
``pp``: pipeline stages; ``cp``: context parallel) and the pipeline's schedule. Ranks are laid
out in the order pp, dp_replicate, dp_shard, cp, tp with tp innermost, so a tensor-parallel
group (and a context-parallel one around it) is a run of adjacent ranks: inside one node when
nodes hold consecutive ranks, as every launcher here places them.

The strategies are layouts of it: ``ddp`` is (dp_replicate=world), ``fsdp`` (dp_shard=world),
``fsdp+tp`` (dp_shard=world/tp, tp). No torch here: the train stage's config is checked in the
workflow's process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import ConfigError

#: the dimensions in rank order, outermost first
DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
#: pipeline schedules (torch.distributed.pipelining); interleaved runs two stages on each rank
SCHEDULES = {"gpipe": 1, "1f1b": 1, "interleaved-1f1b": 2}


class Coords(NamedTuple):
    """Where one rank sits: the batch it is fed (``dp`` of ``dp_size``) and what it runs."""

    pp: int
    dp: int
    dp_size: int
    cp: int
    tp: int


@dataclass(frozen=True)
class Layout:
    """The sizes of the parallel dimensions (their product is the world size) and the pipeline's
    schedule. ``pp_microbatches``: 0 for one per stage; ``pp_split``: the first block of every
    stage but the first (empty: blocks shared out evenly)."""

    dp_replicate: int = 1
    dp_shard: int = -1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    pp_schedule: str = "1f1b"
    pp_microbatches: int = 0
    pp_split: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("dp_replicate", "tp", "pp", "cp"):
            if not _whole(getattr(self, name)) or getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be a whole number >= 1, got {getattr(self, name)!r}")
        if not _whole(self.dp_shard) or (self.dp_shard < 1 and self.dp_shard != -1):
            raise ConfigError(f"dp_shard: must be a whole number >= 1, or -1 for the ranks the other "
                              f"dimensions leave; got {self.dp_shard!r}")
        schedule = str(self.pp_schedule).strip().lower().replace("_", "-")
        if schedule not in SCHEDULES:
            raise ConfigError(f"pp_schedule: {self.pp_schedule!r} is not one of {', '.join(SCHEDULES)}")
        object.__setattr__(self, "pp_schedule", schedule)
        if not _whole(self.pp_microbatches) or self.pp_microbatches < 0:
            raise ConfigError(f"pp_microbatches: must be a whole number >= 1 (0: one per stage), got "
                              f"{self.pp_microbatches!r}")
        split = tuple(self.pp_split)
        if split and len(split) != self.stages - 1:
            raise ConfigError(f"pp_split: {list(split)} gives {len(split) + 1} stages, but pp={self.pp} with "
                              f"schedule {self.pp_schedule} runs {self.stages}: list the first block of each "
                              f"stage but the first, {self.stages - 1} numbers")
        if any(not _whole(b) for b in split) or list(split) != sorted(set(split)) or (split and split[0] < 1):
            raise ConfigError(f"pp_split: {list(split)} must be increasing block numbers >= 1")
        object.__setattr__(self, "pp_split", split)

    @property
    def stages(self) -> int:
        """Pipeline stages in all (two per rank for the interleaved schedule)."""
        return self.pp * SCHEDULES[self.pp_schedule] if self.pp > 1 else 1

    @property
    def microbatches(self) -> int:
        return self.pp_microbatches or self.stages

    def sizes(self, world: int) -> dict[str, int]:
        """Every dimension's size at this world size (dp_shard=-1 resolved); a ConfigError when
        they do not multiply to ``world``."""
        others = self.dp_replicate * self.tp * self.pp * self.cp
        shard = self.dp_shard if self.dp_shard != -1 else world // others if world % others == 0 else 0
        sizes = {"pp": self.pp, "dp_replicate": self.dp_replicate, "dp_shard": shard, "cp": self.cp, "tp": self.tp}
        if shard < 1 or math.prod(sizes.values()) != world:
            given = " x ".join(f"{d}={getattr(self, d)}" for d in DIMS if getattr(self, d) not in (1, -1))
            raise ConfigError(
                f"parallel: {given or 'every size 1'} does not fill the {world} ranks launched: the sizes must "
                f"multiply to the world size (dp_shard: -1 takes the ranks the others leave, when they divide {world})")
        return sizes

    def check(self, world: int, local_world: int, blocks: int | None = None) -> dict[str, int]:
        """The sizes, after checking they fit ``world`` ranks of ``local_world`` per node and a model
        of ``blocks`` repeated blocks; the same ConfigError on every rank otherwise."""
        sizes = self.sizes(world)
        inner = self.tp * self.cp
        if inner > 1 and (local_world % inner or world % local_world):
            raise ConfigError(
                f"parallel: tp={self.tp} x cp={self.cp} = {inner} ranks per group, but a node holds "
                f"{local_world}: a tensor- or context-parallel group must lie inside one node (its "
                f"collectives run at every layer); use tp x cp dividing {local_world}")
        if self.pp > 1 and blocks is not None:
            if self.stages > blocks:
                raise ConfigError(f"parallel: pp={self.pp} ({self.stages} stages with {self.pp_schedule}) is more "
                                  f"stages than the model's {blocks} blocks: use pp <= {blocks // SCHEDULES[self.pp_schedule]}")
            if self.pp_split and self.pp_split[-1] >= blocks:
                raise ConfigError(f"pp_split: {list(self.pp_split)} names block {self.pp_split[-1]}, but the model "
                                  f"has {blocks} (0 to {blocks - 1})")
        return sizes

    def coords(self, rank: int, world: int) -> Coords:
        """This rank's coordinates (pure arithmetic, row-major in ``DIMS`` order)."""
        sizes = self.sizes(world)
        index = {}
        for dim in reversed(DIMS):
            index[dim], rank = rank % sizes[dim], rank // sizes[dim]
        return Coords(index["pp"], index["dp_replicate"] * sizes["dp_shard"] + index["dp_shard"],
                      sizes["dp_replicate"] * sizes["dp_shard"], index["cp"], index["tp"])

    def describe(self, world: int) -> str:
        return " x ".join(f"{k}={v}" for k, v in self.sizes(world).items() if v > 1) or "one rank"


def from_strategy(strategy: str, world: int, tp_size: int | None = None) -> Layout:
    """The layout a strategy name stands for (``normalize_strategy``'s spelling)."""
    if strategy == "fsdp+tp":
        return Layout(tp=tp_size or 1)
    if strategy == "fsdp":
        return Layout()
    return Layout(dp_replicate=world, dp_shard=1)  # ddp, and none: every rank its own batch


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
