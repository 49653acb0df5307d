"""Where this process sits among the ranks of a job, resolved once.

The launcher tells each rank who it is through environment variables. They are
read in this order, the first source whose rank *and* size are both set wins:

====================  =====================================================
``rank_source``       variables: rank, size [, local rank, local size]
====================  =====================================================
``torchrun``          RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
``pals`` (Cray PALS)  PALS_RANKID, PMI_SIZE, PALS_LOCAL_RANKID, PALS_LOCAL_SIZE
``mpich`` (PMI)       PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
``openmpi``           OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}
``slurm``             SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, ...
                      (only inside a job step: SLURM_STEP_ID is set; a batch
                      shell also has SLURM_PROCID=0 and must not count)
``single``            nothing set: one process
====================  =====================================================

A local rank missing from the winning source is taken from the others that are
present (``srun --mpi=pmi2`` sets PMI_RANK but only Slurm knows the local id), then
from PMI_LOCAL_RANK, PMIX_LOCAL_RANK or MPICH_LOCALRANKID.

The master address is MASTER_ADDR, else rank 0's hostname broadcast over
mpi4py (MPI launchers only, mpi4py optional), else the first host of the node
list (SLURM_STEP_NODELIST / SLURM_JOB_NODELIST, PBS_NODEFILE), else 127.0.0.1
when every rank is on this node. A broadcast that degenerates (mpi4py built
against another MPI: every rank is its own COMM_WORLD) raises instead of
letting ranks wait on each other forever.
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import socket
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..common import settings
from ..errors import TopologyError

#: rank sources that mean "an MPI launcher started us" (mpi4py can talk to the others)
MPI_SOURCES = ("pals", "mpich", "openmpi")


@dataclass(frozen=True)
class Topology:
    """One rank's view of its job. Frozen: resolve once, pass around.

    ``rank_source`` says which environment variables described the ranks
    (torchrun, pals, mpich, openmpi, slurm, single): not the launcher program,
    which may differ (``srun --mpi=pmi2`` gives ``mpich``).
    """

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    num_nodes: int
    nodes: tuple[str, ...]
    master_addr: str | None
    master_port: int | None
    rank_source: str
    hostname: str


@dataclass(frozen=True)
class _Source:
    name: str
    rank: str
    size: str
    local_rank: str
    local_size: str


_SOURCES = (
    _Source("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    _Source("pals", "PALS_RANKID", "PMI_SIZE", "PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE"),
    _Source("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    _Source(
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    _Source("slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", ""),
)


#: local-rank variables of launchers that are no rank source here (PMI-1/2, PMIx, MPICH's Hydra)
LOCAL_RANK_HINTS = ("PMI_LOCAL_RANK", "PMIX_LOCAL_RANK", "MPICH_LOCALRANKID")


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise TopologyError(
            f"environment variable {name}={raw!r} is not an integer: "
            f"unset it or fix the launcher that sets it"
        ) from None


def _active(env: Mapping[str, str], src: _Source) -> bool:
    if src.name == "slurm" and "SLURM_STEP_ID" not in env:
        return False  # a batch shell, not a task of srun
    return _int(env, src.rank) is not None and _int(env, src.size) is not None


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a Slurm hostlist such as ``nid[001-003,007],login1``."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", hostlist):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            hosts.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{str(i).zfill(len(lo))}{suffix}")
    return hosts


def _node_list(env: Mapping[str, str], source: str) -> tuple[str, ...]:
    if source == "slurm" or "SLURM_STEP_ID" in env:
        hostlist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if hostlist:
            return tuple(expand_hostlist(hostlist))
    nodefile = env.get("PBS_NODEFILE")
    if nodefile and os.path.isfile(nodefile):
        with open(nodefile) as f:
            return tuple(dict.fromkeys(line.strip() for line in f if line.strip()))
    return ()


def _check_world_sizes(env: Mapping[str, str], chosen: _Source, world: int) -> None:
    """Sizes that describe the same set of processes must agree.

    torchrun may legitimately run inside an MPI or Slurm allocation (one
    torchrun per node), so its WORLD_SIZE is only compared when RANK is absent
    (a stale WORLD_SIZE left in the shell).
    """
    peers = [s for s in _SOURCES if s.name in MPI_SOURCES] if chosen.name in MPI_SOURCES else []
    if "RANK" not in env and chosen.name != "torchrun":
        peers.append(_SOURCES[0])
    for src in peers:
        other = _int(env, src.size)
        if other is not None and other != world:
            raise TopologyError(
                f"world size disagrees between launchers: {chosen.size}={world} "
                f"({chosen.name}) but {src.size}={other} ({src.name}); "
                f"unset the stale {src.size} or launch with one launcher"
            )


def _local(env: Mapping[str, str], chosen: _Source, rank: int, world: int,
           nodes: tuple[str, ...]) -> tuple[int, int]:
    """(local rank, ranks on this node): the chosen source first, then any other launcher's hint."""
    local_rank = local_size = None
    for src in (chosen, *_SOURCES):
        if src.name == "slurm" and "SLURM_STEP_ID" not in env:
            continue
        if local_rank is None:
            local_rank = _int(env, src.local_rank) if src.local_rank else None
        if local_size is None and src.local_size:
            local_size = _int(env, src.local_size)
    if local_rank is None:  # what PMI, PMIx and Hydra set without a full source (ezpz reads them too)
        local_rank = next((v for v in (_int(env, name) for name in LOCAL_RANK_HINTS) if v is not None), None)
    if local_size is None and "SLURM_STEP_ID" in env:
        local_size = _slurm_tasks_on_my_node(env)

    if local_size is None:
        local_size = world if len(nodes) <= 1 else None
    if local_size is None:
        raise TopologyError(
            f"cannot tell how many ranks share this node ({chosen.name} sets no "
            f"local size): set LOCAL_WORLD_SIZE, or launch with mpiexec/srun/torchrun"
        )
    if local_rank is None:
        local_rank = rank % local_size
    if not 0 <= local_rank < local_size:
        raise TopologyError(
            f"local rank {local_rank} is outside 0..{local_size - 1} "
            f"({chosen.name}): the launcher environment is inconsistent"
        )
    return local_rank, local_size


def topology_from_env(env: Mapping[str, str] | None = None, hostname: str | None = None) -> Topology:
    """The topology the environment describes, without any communication.

    ``master_addr``/``master_port`` are only what MASTER_ADDR/MASTER_PORT say;
    :func:`resolve_master` fills them in.
    """
    env = os.environ if env is None else env
    hostname = hostname or socket.gethostname()
    chosen = next((s for s in _SOURCES if _active(env, s)), None)
    if chosen is None:
        return Topology(0, 0, 1, 1, 1, (hostname,), env.get("MASTER_ADDR"),
                        _int(env, "MASTER_PORT"), "single", hostname)

    rank, world = _int(env, chosen.rank), _int(env, chosen.size)
    assert rank is not None and world is not None
    if world < 1 or not 0 <= rank < world:
        raise TopologyError(
            f"{chosen.rank}={rank} is not a rank of {chosen.size}={world} "
            f"({chosen.name}): the launcher environment is inconsistent"
        )
    _check_world_sizes(env, chosen, world)

    nodes = _node_list(env, chosen.name)
    local_rank, local_size = _local(env, chosen, rank, world, nodes)
    num_nodes = max(1, -(-world // local_size))
    return Topology(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_size,
        num_nodes=num_nodes,
        nodes=nodes or (hostname,),
        master_addr=env.get("MASTER_ADDR") or None,
        master_port=_int(env, "MASTER_PORT"),
        rank_source=chosen.name,
        hostname=hostname,
    )


def describe_rank_source(topo: Topology, env: Mapping[str, str] | None = None) -> str:
    """Where the ranks came from, for logs: under parsl-torch's shim the torchrun variables were
    derived from the launcher's (``mpich, via parsl-torch's shim``), unless a torchrun started
    below the shim set its own (rank or size differ)."""
    env = os.environ if env is None else env
    source, _, ranks = (settings.SHIM_SOURCE.get(env) or "").partition(":")
    if topo.rank_source == "torchrun" and source and ranks == f"{topo.rank}:{topo.world_size}":
        return f"{source}, via parsl-torch's shim"
    return topo.rank_source


def _slurm_tasks_on_my_node(env: Mapping[str, str]) -> int | None:
    """Tasks of this step on this node, from SLURM_STEP_TASKS_PER_NODE (``2(x3),1``)."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node_id = _int(env, "SLURM_NODEID") or 0
    if not spec:
        return None
    counts: list[int] = []
    for item in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node_id] if node_id < len(counts) else None


# Rendezvous ports come from below Linux's default ephemeral range (32768-60999):
# a port handed out for outgoing connections can be taken by any connect() on the
# host between the moment it is chosen and the moment rank 0's store binds it
# (CI saw EADDRINUSE that way), and a client whose own ephemeral port equals the
# store's connects to itself.
RENDEZVOUS_PORTS = range(20000, 32768)
#: ports of that range tried before the kernel picks one
PORT_TRIES = 50


def free_port() -> int:
    """A TCP port, outside the ephemeral range, that nothing on this host holds now,
    reserved for a minute (:func:`_reserve`) so that a concurrent launch does not pick it too."""
    for _ in range(PORT_TRIES):
        port = RENDEZVOUS_PORTS[secrets.randbelow(len(RENDEZVOUS_PORTS))]  # not the user's seeded random
        try:
            return _reserve(port)
        except OSError:
            continue
    return _reserve(0)  # that range is full: let the kernel pick


def _reserve(port: int) -> int:
    """Bind ``port`` (0: any), then leave it in TIME_WAIT: for a minute a plain bind of it (this
    function's, in every other launch) fails, while a bind with SO_REUSEADDR (rank 0's TCPStore,
    either backend) succeeds. Between choosing a port and rank 0 binding it lie seconds of
    process start; two launches on one node chose the same port there (CI saw EADDRINUSE)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("", port))  # plain: fails where a store listens or a reservation lies
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the store's later bind may share
        server.listen(1)
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = server.accept()
            accepted.close()  # this end closes first: its side of the connection waits in TIME_WAIT
    return port


def _job_port(env: Mapping[str, str], one_node: bool) -> int:
    """A port every rank derives alike, without communication, from the job's
    ids, and on one node from the launcher's pid, so that concurrent launches
    on the same node (several Parsl tasks) do not collide."""
    keys = ("SLURM_JOB_ID", "SLURM_STEP_ID", "PBS_JOBID", "PALS_APID", "PMI_JOBID")
    job = "/".join(env.get(k, "") for k in keys)
    if one_node:
        job += f"/{os.getppid()}"
    return RENDEZVOUS_PORTS[zlib.crc32(job.encode()) % len(RENDEZVOUS_PORTS)]


def _broadcast_master(topo: Topology) -> tuple[str, int] | None:
    """Rank 0's hostname and a free port of its, over mpi4py; None without mpi4py."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    comm = MPI.COMM_WORLD
    if comm.Get_size() != topo.world_size:
        raise TopologyError(
            f"mpi4py sees {comm.Get_size()} rank(s) in COMM_WORLD but the {topo.rank_source} "
            f"launcher started {topo.world_size}: mpi4py is built against a different MPI "
            f"than the one launching (every rank would wait for the others forever). "
            f"Fix: install mpi4py for this MPI (pip install mpi4py mpich, or build it with "
            f"the system mpicc), or set MASTER_ADDR and MASTER_PORT"
        )
    if comm.Get_rank() != topo.rank:
        raise TopologyError(
            f"mpi4py rank {comm.Get_rank()} differs from the launcher's rank {topo.rank}"
        )
    mine = (socket.gethostname(), free_port()) if topo.rank == 0 else None
    return comm.bcast(mine, root=0)


def resolve_master(topo: Topology, env: Mapping[str, str] | None = None, use_mpi: bool = True) -> Topology:
    """Fill in master_addr/port. Collective under MPI launchers (unless
    ``use_mpi=False``, for processes that must not initialise MPI): call on every rank."""
    env = os.environ if env is None else env
    if topo.master_addr and topo.master_port:
        return topo
    if topo.world_size == 1:
        return replace(topo, master_addr=topo.master_addr or "127.0.0.1",
                       master_port=topo.master_port or free_port())
    found = _broadcast_master(topo) if use_mpi and topo.rank_source in MPI_SOURCES else None
    if found is not None:
        addr, port = found
    elif topo.nodes and (len(topo.nodes) > 1 or topo.num_nodes == 1):
        one_node = topo.num_nodes == 1
        addr, port = ("127.0.0.1" if one_node else topo.nodes[0]), _job_port(env, one_node)
    else:
        raise TopologyError(
            f"cannot find the master address for {topo.world_size} ranks on "
            f"{topo.num_nodes} nodes ({topo.rank_source}): set MASTER_ADDR, or install mpi4py"
        )
    return replace(topo, master_addr=topo.master_addr or addr, master_port=topo.master_port or port)


@functools.lru_cache(maxsize=1)
def env_topology() -> Topology:
    """This process's topology from the environment alone (cheap, no communication)."""
    return topology_from_env()


@functools.lru_cache(maxsize=1)
def get_topology() -> Topology:
    """This process's topology with its master address; resolved once per process.

    Under an MPI launcher without MASTER_ADDR the first call is collective.
    """
    return resolve_master(env_topology())
