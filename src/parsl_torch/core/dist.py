"""Process-group lifecycle: setup_torch, cleanup, barrier, breakpoint, and
the clean end of a rank's process (exit_process)."""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import pdb
import random
import sys
import time
from typing import NoReturn

from ..common import settings
from ..common.pmi import finish_pmi
from ..common.raised import report_uncaught
from ..errors import ConfigError
from .claim import SHARING_BACKENDS, claim_device, device_key
from .device import check_backend, get_backend, get_torch_device, get_torch_device_type
from .log import get_logger
from .ranks import get_rank, process_group, rank_state
from .topology import describe_rank_source, env_topology, get_topology

#: seconds the main thread lets go of the GIL at exit, before the interpreter finalizes
EXIT_HANDOVER_S = 0.05


def _hand_over_gil_at_exit() -> None:
    """Let the backends' worker threads drop the last collectives' work while they still can.

    Collectives issued during backward (DDP's buckets, FSDP's reduce-scatter) carry
    the Python context torch stashes there; the worker thread that drops such a work
    last needs the GIL, and taking it once the interpreter is finalizing ends the
    thread inside a C++ destructor: "terminate called without an active exception",
    SIGABRT, after all the rank's work (8 of 25 2-rank DDP runs that exit right after
    backward, here; 0 of 25 with this). An atexit handler runs while other threads
    may still take the GIL: a short sleep gives it to them."""
    time.sleep(EXIT_HANDOVER_S)


def collective_timeout(timeout: float | None = None) -> float:
    """Seconds: ``timeout``, else PARSL_TORCH_TIMEOUT, else 300."""
    value = float(timeout) if timeout is not None else settings.TIMEOUT.get()
    if value <= 0:
        raise ConfigError(f"collective timeout must be > 0 seconds, got {value}")
    return value


def setup_torch(backend: str | None = None, seed: int | None = None,
                timeout: float | None = None) -> int:
    """Bind this rank's device, start the process group, return the global rank.

    Everything that can be wrong with the environment is checked before any
    communication, so a bad setting fails every rank at once instead of
    leaving some of them waiting. ``seed`` seeds torch, numpy and random alike
    on every rank (same model init). Calling it again is a no-op.
    """
    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    report_uncaught()  # under parsl-torch's shim: the launch's error names the exception that ends this rank
    topo = env_topology()
    device_type = get_torch_device_type()
    backend = check_backend(backend.lower(), device_type) if backend else get_backend(device_type)
    timeout_s = collective_timeout(timeout)
    if seed is not None:
        _seed_everything(seed)
    if dist.is_initialized():
        return dist.get_rank()

    _whole_lines_on_stdio()
    device = get_torch_device(topo.local_rank)
    accelerator = device_type in ("cuda", "xpu")
    if accelerator:  # before init: an unbound device deadlocks XPU collectives
        getattr(torch, device_type).set_device(device)
    topo = get_topology()
    timeout_td = datetime.timedelta(seconds=timeout_s)
    if accelerator and backend not in SHARING_BACKENDS:  # one rank per device, checked before nccl sees it
        store = dist.TCPStore(topo.master_addr, topo.master_port, topo.world_size, is_master=topo.rank == 0,
                              timeout=timeout_td, multi_tenant=True)
        claim_device(store, topo.hostname, device_key(device), topo.world_size, timeout_s,
                     ranks_on_node=topo.local_world_size, visible=getattr(torch, device_type).device_count(),
                     backend=backend)
        dist.init_process_group(backend=backend, store=store, rank=topo.rank, world_size=topo.world_size,
                                timeout=timeout_td, device_id=device)
    else:
        addr = f"[{topo.master_addr}]" if ":" in (topo.master_addr or "") else topo.master_addr
        dist.init_process_group(backend=backend, init_method=f"tcp://{addr}:{topo.master_port}", rank=topo.rank,
                                world_size=topo.world_size, timeout=timeout_td,
                                device_id=device if accelerator else None)
    _wait_for_every_rank(dist)
    state = rank_state()
    if not state.exit_handover:  # registered after the user's earlier handlers: it runs after later ones
        atexit.register(_hand_over_gil_at_exit)
        state.exit_handover = True
    get_logger("parsl_torch").info(
        "setup_torch: rank %d/%d, %d node(s), ranks from %s, device %s, backend %s, "
        "master %s:%s, timeout %.0fs (%.2fs)",
        topo.rank, topo.world_size, topo.num_nodes, describe_rank_source(topo), device, backend,
        topo.master_addr, topo.master_port, timeout_s, time.perf_counter() - t0,
    )
    return topo.rank


def _wait_for_every_rank(dist) -> None:
    """Return only once every rank has joined the process group.

    ``init_process_group`` returns on a rank as soon as its own connections are up, not
    everyone's: a rank with nothing to communicate (a stage that returns at once) could
    finish and exit while a slower peer was still joining. Its exit closes its end of
    the connections (and, on rank 0, the store), and the slower peer, which did nothing
    wrong, fails at start ("Gloo connectFullMesh failed ... Connection closed by peer",
    or "Failed to recv, got 0 bytes" from the store). One barrier here (about a
    millisecond) makes leaving before everyone has joined impossible."""
    dist.barrier()


def _whole_lines_on_stdio() -> None:
    """Make unbuffered stdout/stderr line-buffered: ranks share the launcher's
    stdout, and under PYTHONUNBUFFERED=1 ``print()`` writes the text and the
    newline separately, so two ranks' lines merge. Line buffering keeps output
    as prompt (a write per line) and each line in one write."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "write_through", False) and not stream.line_buffering:
            stream.reconfigure(line_buffering=True, write_through=False)


def _seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def barrier() -> None:
    """Wait for every rank; a no-op without a process group."""
    if d := process_group():
        d.barrier()


def exit_process(code: int = 0) -> NoReturn:
    """End a rank's process once its work is written: atexit handlers run
    (wandb, user code), interpreter finalization does not.

    Nothing of torch's can run during finalization then (see
    ``_hand_over_gil_at_exit`` for the abort it can cause there). MPI is
    finalized here, PMI included (``common.pmi``), which os._exit would skip.
    """
    import logging

    # private, but the only way to run the registered handlers without also running
    # interpreter finalization (where torch's destructors abort)
    atexit._run_exitfuncs()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()  # mpi4py finalizes in a C exit hook, which os._exit skips; mpiexec needs it
    finish_pmi()  # (with MPI or without: common.pmi)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def cleanup() -> None:
    """Destroy the process group if there is one (safe to call twice)."""
    if d := process_group():
        for release in list(rank_state().before_cleanup):  # work in flight must not outlive its group
            release()
        d.destroy_process_group()


class _RankPdb(pdb.Pdb):
    """A pdb that releases the waiting ranks when the user continues."""

    def __init__(self, release) -> None:
        super().__init__()
        self._release = release

    def set_continue(self) -> None:
        super().set_continue()
        self._release()


def breakpoint(rank: int = 0) -> None:  # noqa: A001 - the ezpz name
    """Drop into pdb on ``rank`` while every other rank waits for ``continue``.

    The others wait on the process group's key-value store, not on a
    collective, so a long debugging session does not trip the collective
    timeout. mpiexec forwards stdin to rank 0 only: debug rank 0 where you can.
    """
    state = rank_state()
    state.breakpoints += 1
    key = f"parsl_torch/breakpoint/{state.breakpoints}"
    d = process_group()
    # the default group's store is private in torch; it is what every rank already
    # connected to, and waiting on it is not a collective (no timeout trips)
    store = d.distributed_c10d._get_default_store() if d else None
    caller = sys._getframe().f_back
    if get_rank() == rank:
        _RankPdb(release=lambda: store and store.set(key, "go")).set_trace(caller)
    elif store is not None:
        store.wait([key], datetime.timedelta(days=7))
