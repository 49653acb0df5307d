"""Simulated nodes for parsl-torch's control plane, on this machine's loopback (``bench_control_plane.py``
measures with it; ``tests/test_control_plane.py`` runs it small).

* ``Supervisor``: the real ``launch.supervise`` in a child process, for ``n`` nodes of ``r`` ranks, its
  launcher a stand-in that sleeps (the nodes are simulated, not launched); it records, in a stats
  file, when every node's hello was in, its CPU time as it goes, and what it decided. A node it names
  lost goes through the real check and into the real quarantine file.
* ``SimNodes``: the nodes, one asyncio task each in a thread of this process (not a process per
  node): each says hello and sends heartbeats on one connection, byte for byte as the shim does
  (``shim.hello_line``); faults: ``silence`` (the connection stays, nothing comes: a powered-off
  node), ``vanish`` (closed without a bye), ``slow`` (heartbeats late, within the node timeout).
  All hellos start at once: the storm a job's start makes.
* ``place``: the real pool scheduler (``launch.poolscheduler``) placing queued one-node stages on a
  block, its queues in memory.
* ``claim_storm``: every rank's device claim (``core.claim``) through one real TCPStore, one
  connection per rank as ranks have; the store's server in a child process.

usage (its children): python benchmarks/simnodes.py serve N R NODE_TIMEOUT WORKDIR
                      python benchmarks/simnodes.py claims PORT N R TIMEOUT SHARED
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from parsl_torch.common import settings
from parsl_torch.launch.shim import HEARTBEAT_S, bye_line, hello_line

JOB = "sim.1"  # the batch job the simulated nodes belong to (the quarantine file is keyed by it)


def node_names(n: int) -> list[str]:
    return [f"sim{i:05d}" for i in range(n)]


# --- the supervisor, in a child process -------------------------------------------------------

def serve(n: int, r: int, node_timeout: float, workdir: Path) -> int:
    """The child: ``supervise`` a stand-in launch of ``n`` x ``r`` ranks, with stats in ``workdir``."""
    from parsl_torch.launch import supervise as sup
    from parsl_torch.launch.plan import LaunchPlan

    stats = workdir / "stats.jsonl"

    class Counting(sup.RankListener):
        """The real listener, and a thread that writes its greeted count and the process's CPU time."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            threading.Thread(target=self._stats, daemon=True).start()

        def _stats(self) -> None:
            all_in = None
            with open(stats, "a") as f:
                while not self._closed:
                    if all_in is None and len(self.greeted) >= n:
                        all_in = time.time()
                        f.write(json.dumps({"all_hellos": all_in}) + "\n")
                    f.write(json.dumps({"t": time.time(), "cpu": time.process_time(), "greeted": len(self.greeted)})
                            + "\n")
                    f.flush()
                    time.sleep(0.05 if all_in is None else 0.5)

    sup.RankListener = Counting
    stand_in = ("import os, sys, time; open(sys.argv[1] + '.tmp', 'w').write(os.environ[sys.argv[2]]); "
                "os.replace(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(3600)")
    plan = LaunchPlan(argv=(sys.executable, "-c", stand_in, str(workdir / "address"), settings.LAUNCH_NOTIFY.name),
                      launcher="mpiexec", scheduler="pbs", machine=None, num_nodes=n, ranks_per_node=r,
                      num_ranks=n * r, nodes=tuple(node_names(n)),
                      env={settings.NODE_TIMEOUT.name: str(node_timeout),
                           settings.QUARANTINE.name: str(workdir / "quarantine.json"), "PBS_JOBID": JOB})
    os.environ.update(PBS_JOBID=JOB, **{settings.QUARANTINE.name: str(workdir / "quarantine.json")})
    code = sup.supervise(plan, check_s=1.0)
    with open(stats, "a") as f:
        f.write(json.dumps({"exit": code, "t_end": time.time(), "cpu": time.process_time()}) + "\n")
    return code


class Supervisor:
    """``serve`` in a child process; ``address`` once it listens; ``stats()`` what it recorded."""

    def __init__(self, n: int, r: int, node_timeout: float, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, __file__, "serve", str(n), str(r), str(node_timeout),
                                      str(self.workdir)], env=env, stderr=open(self.workdir / "stderr", "w"))
        deadline = time.monotonic() + 60
        while not (self.workdir / "address").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the supervisor did not start: {(self.workdir / 'stderr').read_text()[-2000:]}")
            time.sleep(0.05)
        self.address = (self.workdir / "address").read_text()

    def stats(self) -> list[dict]:
        path = self.workdir / "stats.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines if line.endswith("}")]

    def first(self, key: str) -> dict | None:
        return next((s for s in self.stats() if key in s), None)

    def cpu_per_s(self, since: float, until: float) -> float:
        """The supervisor's CPU seconds per second of wall time between two instants."""
        samples = [s for s in self.stats() if "greeted" in s and since <= s["t"] <= until]
        if len(samples) < 2:
            raise RuntimeError("too few samples of the supervisor's CPU time")
        return (samples[-1]["cpu"] - samples[0]["cpu"]) / (samples[-1]["t"] - samples[0]["t"])

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


# --- the nodes --------------------------------------------------------------------------------

class SimNodes:
    """``n`` nodes of ``r`` ranks, speaking to ``address`` (``host:port:token``) from one asyncio loop."""

    def __init__(self, address: str, n: int, r: int, heartbeat_s: float = HEARTBEAT_S) -> None:
        host, port, self.token = address.rsplit(":", 2)
        self.host, self.port, self.r, self.heartbeat_s = host, int(port), r, heartbeat_s
        self.names = node_names(n)
        self.period = {name: heartbeat_s for name in self.names}
        self.silent: set[str] = set()
        self.connected: dict[str, float] = {}  # name -> when its hello was sent (time.time())
        self.last_beat: dict[str, float] = {}  # name -> when it last sent anything
        self.failed: dict[str, str] = {}
        self._writers: dict[str, asyncio.StreamWriter] = {}
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def start(self) -> float:
        """Every node's hello at once; returns when all are sent (or failed): the time it took."""
        t0 = time.time()
        asyncio.run_coroutine_threadsafe(self._all(), self.loop).result(timeout=600)
        return time.time() - t0

    async def _all(self) -> None:
        await asyncio.gather(*(self._hello(i, name) for i, name in enumerate(self.names)))

    async def _hello(self, i: int, name: str) -> None:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), timeout=60)
            writer.write(hello_line(self.token, name, i * self.r, self.r))
            await writer.drain()
        except (OSError, asyncio.TimeoutError) as exc:
            self.failed[name] = repr(exc)
            return
        self.connected[name] = self.last_beat[name] = time.time()
        self._writers[name] = writer
        self.loop.create_task(self._beat(name, writer))

    async def _beat(self, name: str, writer: asyncio.StreamWriter) -> None:
        while name in self._writers:
            await asyncio.sleep(self.period[name])
            if name in self.silent or name not in self._writers:
                continue  # (a silent node keeps its connection and sends nothing)
            try:
                writer.write(b"\n")
                await writer.drain()
            except OSError:
                return
            self.last_beat[name] = time.time()

    def silence(self, name: str) -> float:
        self.silent.add(name)
        return time.time()

    def slow(self, name: str, period: float) -> None:
        self.period[name] = period

    def vanish(self, name: str) -> float:
        asyncio.run_coroutine_threadsafe(self._close(name, bye=False), self.loop).result(timeout=30)
        return time.time()

    def close(self) -> None:
        """Every node says bye and closes, as finished ranks' shims do."""
        async def all_bye() -> None:
            await asyncio.gather(*(self._close(name, bye=True) for name in list(self._writers)))
            beats = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in beats:  # (each stops at its next beat; not left pending when the loop stops)
                task.cancel()
            await asyncio.gather(*beats, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(all_bye(), self.loop).result(timeout=120)
        self.loop.call_soon_threadsafe(self.loop.stop)

    async def _close(self, name: str, bye: bool) -> None:
        writer = self._writers.pop(name, None)
        if writer is None:
            return
        try:
            if bye:
                writer.write(bye_line(self.token))
                await writer.drain()
            writer.close()
        except OSError:
            pass


# --- placement --------------------------------------------------------------------------------

def place(n_nodes: int, n_tasks: int, workdir: Path, ranks_per_node: int = 12) -> list[float]:
    """``n_tasks`` one-node stages queued on a block of ``n_nodes`` nodes, placed by the real pool
    scheduler as earlier ones end (in random order); every decision's seconds (a put or a result)."""
    nodefile = Path(workdir) / "nodefile"
    nodefile.write_text("\n".join(node_names(n_nodes)) + "\n")
    with in_job(nodefile):
        return _place(n_nodes, n_tasks, workdir, ranks_per_node)


@contextlib.contextmanager
def in_job(nodefile: Path) -> Iterator[None]:
    """This process as if in the simulated PBS job whose nodes ``nodefile`` lists (as a block's worker
    pool is); its environment as it was afterwards."""
    saved = {k: os.environ.get(k) for k in ("PBS_NODEFILE", "PBS_JOBID", "SLURM_NODELIST")}
    os.environ.update(PBS_NODEFILE=str(nodefile), PBS_JOBID=JOB)
    os.environ.pop("SLURM_NODELIST", None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _place(n_nodes: int, n_tasks: int, workdir: Path, ranks_per_node: int) -> list[float]:
    import random

    from parsl_torch.launch.pool import scheduler_class

    tasks, results = queue.Queue(), queue.Queue()
    scheduler = scheduler_class(str(Path(workdir) / "quarantine.json"), 0, (), "CUDA_VISIBLE_DEVICES")(tasks, results)
    spec = {"num_nodes": 1, "num_ranks": ranks_per_node, "ranks_per_node": ranks_per_node}
    times, running, rng = [], [], random.Random(0)
    for tid in range(n_tasks):
        t0 = time.perf_counter()
        scheduler.put_task({"task_id": tid, "context": {"resource_spec": dict(spec)}})
        times.append(time.perf_counter() - t0)
    started = []
    while not tasks.empty() or running:
        while not tasks.empty():
            running.append(tasks.get()["task_id"])
            started.append(running[-1])
        tid = running.pop(rng.randrange(len(running)))
        results.put(pickle.dumps({"type": "result", "task_id": tid}))
        t0 = time.perf_counter()
        scheduler.get_result(block=False)
        times.append(time.perf_counter() - t0)
    if sorted(started) != list(range(n_tasks)):
        raise RuntimeError(f"{len(started)} placements for {n_tasks} stages ({len(set(started))} distinct)")
    return times


# --- the claim through one store --------------------------------------------------------------

STORE = """
import resource, sys, time
from torch.distributed import TCPStore
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
print(store.port, flush=True)
time.sleep(float(sys.argv[1]))
"""
#: this sandbox's resolver names a server it cannot reach, and torch's store looks up the name of every
#: socket's peer (for its log lines): without this each lookup that misses /etc/hosts waits 5 s
RESOLVER = {"RES_OPTIONS": "timeout:1 attempts:1"}


def fd_limit() -> int:
    import resource

    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def claim_storm(n: int, r: int, timeout_s: float = 300, shared: bool = False) -> dict:
    """Every one of ``n`` x ``r`` ranks claims its node's device ``local_rank`` (``core.claim``) through
    one TCPStore, from a thread and a connection of its own (both sides in child processes): the
    seconds until every rank had connected (``connect_s``), then until every rank had its claim's
    answer (``claim_s``). ``shared``: node 0's second rank claims its first rank's device (every rank
    must then be refused)."""
    env = {**os.environ, **RESOLVER}
    server = subprocess.Popen([sys.executable, "-c", STORE, str(timeout_s)], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        port = server.stdout.readline().strip()
        out = subprocess.run([sys.executable, __file__, "claims", port, str(n), str(r), str(timeout_s), str(int(shared))],
                             capture_output=True, text=True, env=env, timeout=timeout_s + 60)
        if out.returncode:
            raise RuntimeError(f"the claims failed: {out.stderr[-2000:]}")
        return {**json.loads(out.stdout.strip().splitlines()[-1]), "store_cpu_s": cpu_seconds(server.pid)}
    finally:
        server.kill()


def cpu_seconds(pid: int) -> float:
    """The CPU time process ``pid`` has used (user + system, from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def claims(port: int, n: int, r: int, timeout_s: float, shared: bool) -> dict:
    """The child of ``claim_storm``: ``n`` x ``r`` threads, each a rank with its own store client."""
    import datetime
    import resource

    from torch.distributed import TCPStore

    from parsl_torch.core.claim import claim_device

    resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit(),) * 2)
    errors: list[str] = []
    connected = threading.Barrier(n * r + 1, timeout=timeout_s)
    claimed = threading.Barrier(n * r + 1, timeout=timeout_s)
    threading.stack_size(256 * 1024)

    def rank(node: int, local: int) -> None:
        store = None
        try:
            store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s),
                             use_libuv=True)
        except Exception as exc:  # noqa: BLE001 - counted and named by the caller
            errors.append(repr(exc))
        connected.wait()
        try:
            if store is not None:
                device = 0 if shared and node == 0 and local == 1 else local
                claim_device(store, f"sim{node:05d}", f"cuda:{device}", n * r, timeout_s, ranks_on_node=r,
                             visible=r, backend="nccl")
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))
        claimed.wait()

    t0 = time.perf_counter()
    for node in range(n):
        for local in range(r):
            threading.Thread(target=rank, args=(node, local), daemon=True).start()
    connected.wait()
    t1 = time.perf_counter()
    claimed.wait()
    return {"connect_s": t1 - t0, "claim_s": time.perf_counter() - t1, "errors": sorted(set(errors))[:5],
            "n_errors": len(errors)}


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    sys.exit(serve(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), Path(sys.argv[5])))
if __name__ == "__main__" and sys.argv[1:2] == ["claims"]:
    print(json.dumps(claims(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]),
                            sys.argv[6] == "1")))
