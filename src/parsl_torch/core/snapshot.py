"""Training state that outlives its process: every few steps each rank keeps its state (model, optimizer,
RNG, step) in its node's memory (``/dev/shm``), and where no other rank holds the same state (sharded
layouts) a copy in the next node's memory too. A rank that starts again for the same computation (a retry
after a lost node or a failed rank) resumes from the newest state every rank can get, read from memory
or sent by the rank whose node holds it, before any checkpoint file.

The copy out of the step is the only stall (tensors to host memory); the file is written by a thread. The
interval is chosen by measurement: the stall at most ``COST`` of the steps it covers.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..common import settings
from .log import get_logger
from .ranks import get_rank, get_world_size
from .topology import env_topology

#: the share of the step time that snapshots may cost (their stall, over the steps between two)
COST = 0.02
#: node memory: a RAM file system on Linux
MEMORY = Path("/dev/shm")
_NAME = re.compile(r"(rank|peer)-(\d+)\.(\d+)\.pt$")


def node_folder(call: str, stage_dir: str, world: int | None) -> Path | None:
    """This computation's folder in node memory (None: no node memory here, or no computation); ``world``:
    the world size its states are for (None: any, replicated states)."""
    if not call or not MEMORY.is_dir() or not os.access(MEMORY, os.W_OK):
        return None
    computation = hashlib.sha256(call.encode()).hexdigest()[:16]
    return _stage_folder(stage_dir) / f"{computation}-{world or 'any'}"


def _stage_folder(stage_dir: str | os.PathLike) -> Path:
    return MEMORY / f"parsl-torch-{os.getuid()}" / hashlib.sha256(os.path.abspath(stage_dir).encode()).hexdigest()[:16]


def forget(run_dir: str | os.PathLike) -> None:
    """What the stages of ``run_dir`` kept in this node's memory, gone: their workflow ended, so no retry of
    theirs can come (a stage that finished took its own; this is a failed one's, which would stay until the
    node restarts). Other nodes' memory ends with their batch job."""
    if not Path(run_dir).is_dir():
        return
    for stage_dir in Path(run_dir).iterdir():
        if stage_dir.is_dir() and (folder := _stage_folder(stage_dir)).exists():
            shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        (MEMORY / f"parsl-torch-{os.getuid()}").rmdir()


class Snapshots:
    """Collective (every rank builds it and calls it at the same steps). ``state()`` returns what to keep
    (tensors on any device, numbers), ``load(state)`` puts it back; ``replicated``: every rank holds the same
    state (data parallel only), so any copy serves any rank and none is sent to another node; ``every``: the
    interval (None: measured). Inactive outside a stage's computation, without node memory, or where
    not ``enabled``."""

    def __init__(self, state: Callable[[], dict[str, Any]], load: Callable[[dict[str, Any]], None],
                 replicated: bool, every: int | None = None, enabled: bool = True) -> None:
        import torch.distributed as dist

        self.state, self.load, self.replicated, self.every, self.fixed = state, load, replicated, every, every
        self.rank, self.world = get_rank(), get_world_size()
        self.folder = node_folder(settings.CALL_ID.raw() or "", settings.STAGE_DIR.raw() or os.getcwd(),
                                  None if replicated else self.world) if enabled else None
        self.group = dist.new_group(backend="gloo") if enabled and dist.is_initialized() and self.world > 1 else None
        # a replicated state is kept once per node (its first rank's), a sharded one by every rank
        self.writes = not replicated or env_topology().local_rank == 0
        self._writer: threading.Thread | None = None
        self._warned = False
        self._writer_cpu = 0.0  # CPU seconds the last snapshot's writer took
        self.stall = 0.0  # seconds the last snapshot held the step
        self._since, self._last = time.perf_counter(), -1

    @property
    def active(self) -> bool:
        return self.folder is not None

    def due(self, step: int) -> bool:
        """Whether to keep the state after ``step`` (0-based; the state is then at ``step + 1``)."""
        return self.active and step - self._last >= (self.every or 1)

    def keep(self, step: int, again: bool = True) -> None:
        """The state after ``step``, kept: copied to host memory now, written to node memory (and sent to
        the next node's, sharded) by a thread; the interval adjusted to the measured stall. Collective.
        ``again=False``: not where the state of ``step`` is kept already (or nothing is kept here)."""
        if not self.active or (not again and self._last == step):
            return
        per_step = (time.perf_counter() - self._since) / max(step - self._last, 1)
        self._last = step
        self.wait()
        t0 = time.perf_counter()
        state = self.state()  # (on every rank: it may be collective)
        host = _to_host(state) if self.writes else None
        self.stall = time.perf_counter() - t0
        if not self.fixed:  # (the writer's CPU too: where the ranks use every core, it is theirs)
            cost = self.stall + self._writer_cpu
            self.every = self._agreed(max(1, math.ceil(cost / (COST * max(per_step, 1e-9)))))
        if host is not None:
            self._writer = threading.Thread(target=self._write, args=(step + 1, host), daemon=True,
                                            name="parsl-torch-snapshot")
            self._writer.start()
        self._since = time.perf_counter()

    def _agreed(self, every: int) -> int:
        """The interval every rank takes (the largest asked): sharded states are exchanged in pairs."""
        if self.group is None:
            return every
        import torch
        import torch.distributed as dist

        value = torch.tensor([every], dtype=torch.int64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.group)
        return int(value.item())

    def wait(self) -> None:
        """Until the last state is written (before the process ends)."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None

    def _write(self, step: int, host: dict[str, Any]) -> None:
        """(The writer thread.) The exchange first, on every rank alike (a rank that could not write must
        still answer its pair), then the files; node memory that is full costs the snapshot, not the run."""
        import torch

        started = time.thread_time()
        buffer = io.BytesIO()
        torch.save(host, buffer)
        data = buffer.getvalue()
        per_node = env_topology().local_world_size
        peer = None
        if not self.replicated and self.group is not None and self.world > per_node:  # (another node to hold it)
            peer = _exchange(self.group, self.rank, self.world, per_node, data)
        try:
            _put(self.folder, f"rank-{self.rank}", step, data)
            if peer is not None:
                _put(self.folder, f"peer-{(self.rank - per_node) % self.world}", step, peer)
        except OSError as exc:
            if not self._warned:
                get_logger(__name__).warning("the state of step %d could not be kept in node memory (%s): a retry "
                                             "resumes from an older one or the checkpoint file", step, exc)
                self._warned = True
        finally:
            self._writer_cpu = time.thread_time() - started

    def restore(self) -> int | None:
        """Collective: the newest state every rank can get, loaded (the step it is at), or None."""
        import torch
        import torch.distributed as dist

        held = _held(self.folder)
        everyone = [held]
        if self.group is not None:
            everyone = [None] * self.world
            dist.all_gather_object(everyone, held, group=self.group)
        step, source = _newest(everyone, self.world, self.replicated)
        if step is None:
            return None
        data = _deliver(self.group, self.rank, step, source, held, self.replicated)
        self.load(torch.load(io.BytesIO(data), weights_only=False))
        self._last, self._since = step - 1, time.perf_counter()
        get_logger(__name__).info("resumed from the state kept in node memory at step %d (no checkpoint file "
                                  "read)", step)
        return step

    def finish(self) -> None:
        """Collective: the computation is done, its state leaves node memory."""
        import torch.distributed as dist

        self.wait()
        if self.group is not None:
            dist.barrier(group=self.group)  # (no rank of this node still writing into it)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            for empty in (self.folder.parent, self.folder.parent.parent):  # (this stage's, the user's: if empty)
                with contextlib.suppress(OSError):
                    empty.rmdir()


def _to_host(value: Any) -> Any:
    """Tensors (a sharded one: this rank's part) copied to host memory, the rest as it is."""
    import torch

    if isinstance(value, torch.Tensor):
        local = value.to_local() if hasattr(value, "to_local") else value
        return local.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v) for v in value)
    return value


def _put(folder: Path, kind: str, step: int, data: bytes) -> None:
    """``data`` whole at ``<kind>.<step>.pt`` in node memory; the older one of that kind gone."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    for stale in folder.parent.iterdir():  # (another computation of this stage: never resumed)
        if stale != folder:
            shutil.rmtree(stale, ignore_errors=True)
    tmp = folder / f".{kind}.{os.getpid()}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, folder / f"{kind}.{step}.pt")
    for old in folder.glob(f"{kind}.*.pt"):
        if old.name != f"{kind}.{step}.pt":
            old.unlink(missing_ok=True)


def _exchange(group: Any, rank: int, world: int, per_node: int, data: bytes) -> bytes:
    """This rank's state to the rank at its place on the next node, that of the one on the previous node back."""
    import torch
    import torch.distributed as dist

    dst, src = (rank + per_node) % world, (rank - per_node) % world
    size = torch.tensor([len(data)], dtype=torch.int64)
    theirs = torch.zeros(1, dtype=torch.int64)
    for work in (dist.isend(size, dst, group=group), dist.irecv(theirs, src, group=group)):
        work.wait()
    out = torch.empty(int(theirs.item()), dtype=torch.uint8)
    sent = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    for work in (dist.isend(sent, dst, group=group), dist.irecv(out, src, group=group)):
        work.wait()
    return out.numpy().tobytes()


def _held(folder: Path | None) -> dict[tuple[str, int, int], str]:
    """(kind, rank, step) -> path of the states this node's memory holds."""
    if folder is None or not folder.is_dir():
        return {}
    found = (_NAME.match(p.name) for p in folder.iterdir())
    return {(m[1], int(m[2]), int(m[3])): str(folder / m[0]) for m in found if m}


def _newest(everyone: list[dict], world: int, replicated: bool) -> tuple[int | None, dict[int, int]]:
    """The newest step at which every rank's state is held somewhere, and for each rank whose own node does
    not hold it, the rank that sends it (None: no such step)."""
    steps = sorted({step for held in everyone for (_, _, step) in held}, reverse=True)
    for step in steps:
        holders = {rank: {r for (_, r, s) in held if s == step} for rank, held in enumerate(everyone)}
        if replicated:
            any_holder = next((rank for rank, held in holders.items() if held), None)
            if any_holder is not None:
                return step, {rank: any_holder for rank, held in holders.items() if not held}
            continue
        source = {}
        for rank in range(world):
            if rank not in holders[rank]:
                sender = next((h for h, held in holders.items() if rank in held), None)
                if sender is None:
                    break
                source[rank] = sender
        else:
            return step, source
    return None, {}


def _deliver(group: Any, rank: int, step: int, source: dict[int, int], held: dict[tuple[str, int, int], str],
             replicated: bool) -> bytes:
    """This rank's state at ``step``: from its node's memory, or sent by the rank whose node holds it
    (collective: every rank walks the same transfers)."""
    import torch.distributed as dist

    def here(rank_of: int) -> str | None:
        path = held.get(("rank", rank_of, step)) or held.get(("peer", rank_of, step))
        return path or (next((p for (_, _, s), p in held.items() if s == step), None) if replicated else None)

    got = None if rank in source else Path(str(here(rank))).read_bytes()
    for receiver, sender in sorted(source.items()):
        if rank == sender:
            dist.send_object_list([Path(str(here(receiver))).read_bytes()], dst=receiver, group=group)
        elif rank == receiver:
            box: list[Any] = [None]
            dist.recv_object_list(box, src=sender, group=group)
            got = box[0]
    assert got is not None
    return got
