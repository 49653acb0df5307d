"""Shared fixtures: launching real ranks and keeping the test process clean."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from parsl_torch.common import settings
from parsl_torch.common.procs import proc_stat

pytest_plugins = ["tests.timings"]  # each test's wall and CPU time: --timings-json, the slowest at the end

BIN = Path(sys.executable).parent
# stages draw no PNGs here but where a test looks at them (the `plots` fixture, the main job, the README's
# examples): rank 0 of every stage would spend about 1 s of the suite's CPU on them (docs/testing.md)
os.environ.setdefault("PARSL_TORCH_PLOTS", "0")
RANKS_DIR = Path(__file__).parent / "ranks"
# variables a launcher sets; a test's child must not inherit them from the runner
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCH_DEVICE", "TORCH_BACKEND", "PBS_NODEFILE", "PBS_JOBID")
LAUNCHER_PREFIXES = ("PMI_", "PALS_", "OMPI_", "SLURM_", "MPI_LOCAL")


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without any launcher variables, with the venv first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)}
    if "SLURM_CONF" in os.environ:
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    """Stand-ins for the system's mpiexec and srun, so golden plans can be built
    here; they are never run."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("mpiexec", "srun"):
        (bindir / name).write_text("#!/bin/sh\nexit 99\n")
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return bindir


def processes_under(directory: Path) -> dict[int, str]:
    """pid -> command line of every process (but this one) whose working directory is in ``directory``."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cwd = Path(os.readlink(proc / "cwd"))
            if cwd == directory or directory in cwd.parents:
                found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        except OSError:
            continue
    return found


def _parents() -> dict[int, int]:
    stats = {int(e.name): proc_stat(e.name) for e in os.scandir("/proc") if e.name.isdigit()}
    return {pid: stat.ppid for pid, stat in stats.items() if stat is not None}


def _carries_a_workflow_token(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return b"PARSL_TORCH_WORKFLOW=" in Path(f"/proc/{pid}/environ").read_bytes()
    return False


def _left_running(base: Path) -> dict[int, str]:
    """Processes working in ``base`` that outlive what started them: any that is no descendant of
    this process (an orphan, e.g. a killed workflow's interchange), a deeper descendant that carries
    a workflow's token (a pool, supervisor or rank of a workflow that ended), or a child Parsl
    titled (an interchange). This process's own helpers (multiprocessing's resource tracker,
    wandb's service) end with it."""
    parents, me = _parents(), os.getpid()

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == me:
                return True
        return False

    return {pid: cmd for pid, cmd in processes_under(base).items()
            if not descends(pid) or (parents.get(pid) != me and _carries_a_workflow_token(pid))
            or cmd.startswith("parsl: ")}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """CI's time budget (``PARSL_TORCH_TEST_DEADLINE``, epoch seconds, set by .ci/run): past it the session
    starts no more tests and reports what failed so far, where CI's own limit would end it with nothing said."""
    deadline = settings.TEST_DEADLINE.get()
    if deadline is not None and config.getoption("session_timeout", None) is None:
        config.option.session_timeout = max(deadline - time.time(), 1.0)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite leaves no process running: none may work in its temporary directories once the
    last test is done (a watchdog gets a few seconds to sweep); any found fails the run."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or exitstatus not in (0, 1):
        return
    base, deadline = factory.getbasetemp(), time.monotonic() + 20
    while (left := _left_running(base)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        print(f"\nthe test suite left processes running in {base}: {left}", file=sys.stderr)
        session.exitstatus = 1


def torch_version() -> tuple[int, int]:
    """The installed torch's (major, minor), without importing it: a test's expectation on an older torch."""
    major, minor = version("torch").split(".")[:2]
    return int(major), int(minor)


def launch(launcher: str, n: int, args: list[str], timeout: float = 180, **kw) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` on n ranks with a real launcher; fails the test on a hang."""
    py = [sys.executable, *args]
    if launcher == "mpiexec":
        cmd = [str(BIN / "mpiexec"), "-n", str(n), *py]
    elif launcher == "torchrun":
        cmd = [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={n}", *args]
    elif launcher == "srun":
        cmd = ["srun", "--mpi=pmi2", "-n", str(n), "--time=5", *py]
    elif launcher == "srun-nompi":
        cmd = ["srun", "--mpi=none", "-n", str(n), "--time=5", *py]
    else:
        raise ValueError(launcher)
    env = kw.pop("env", None) or clean_env()
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)


#: fixtures that stand for something the machine has once: their tests run one at a time, in one
#: worker of a parallel run (the namespace cluster's bridge and Slurm; the one-node Slurm's two CPUs)
MACHINE_WIDE = {"cluster_session": "cluster", "slurm": "slurm"}


def _group(item: pytest.Item) -> str | None:
    """The xdist group a test must run in: one per machine-wide resource, and one per fixture shared
    wider than a test (a module's trained checkpoint, endpoint or workdir: paid once, in one worker,
    and the tests that build on each other's files stay in order)."""
    names = item.fixturenames
    for fixture, group in MACHINE_WIDE.items():
        if fixture in names:
            return group
    for name, defs in item._fixtureinfo.name2fixturedefs.items():
        if defs and defs[-1].scope in ("module", "package", "class") and name in names:
            return f"{Path(item.path).stem}.{name}"
    return None


def _join(item: pytest.Item, group: str) -> None:
    """Put a test in an xdist group: its node id ends in ``@group``, which is all xdist's scheduler
    reads. xdist's own xdist_group marker sets ``item._nodeid``, which pytest 9.2 no longer reads (its
    id is ``item._id``): the groups were silently ignored, so this sets whichever the pytest has, and
    refuses to run rather than spread one group's tests over several workers."""
    name = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(name)
    else:
        item._nodeid = name
    if item.nodeid != name:
        raise pytest.UsageError(f"cannot put {item.nodeid} in the xdist group {group!r} with this pytest: "
                                f"run without -n (tests/conftest.py _join)")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a parallel run (pytest -n N --dist loadgroup, as make test does) each test gets its group, and
    the multi-process tests go first so that the quick ones fill the end; tests marked ``gpu`` run
    where torch sees a CUDA GPU (the accelerator machine), else are skipped."""
    if getattr(config.option, "loadgroup", False):  # xdist's workers (there, dist is "no")
        for item in items:
            if group := _group(item):
                _join(item, group)
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU: run on the accelerator machine (docs/testing.md)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture
def slurm() -> None:
    """A running Slurm cluster (CI starts one with tests/slurm/start-slurm.sh)."""
    if not os.environ.get("SLURM_CONF") or not shutil.which("srun"):
        if os.environ.get("PARSL_TORCH_REQUIRE_SLURM"):
            pytest.fail("PARSL_TORCH_REQUIRE_SLURM is set but no Slurm cluster is running")
        pytest.skip("no Slurm cluster: run bash tests/slurm/start-slurm.sh (root) and "
                    "source /tmp/slurm-local/slurm.env (CI does)")


@pytest.fixture(autouse=True)
def _no_leaked_master_env():
    """Tests must not leave MASTER_ADDR/MASTER_PORT behind for later tests."""
    before = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    yield
    after = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    assert after == before, f"test leaked {after}"


class Cluster:
    """The multi-node test cluster (tests/cluster/cluster.py) as tests use it."""

    def __init__(self, module, nodes: list[str]) -> None:
        self.module, self.nodes = module, nodes
        self.state = module.STATE

    def env(self) -> dict[str, str]:
        """What a test exports to use the cluster: its Slurm, the fake PBS, hydra over nsexec."""
        env = self.module.env_lines(self.nodes)
        env["SLURM_CONF"] = env["PT_CLUSTER_SLURM_CONF"]
        env["PATH"] = f"{FAKE_PBS}{os.pathsep}{BIN}{os.pathsep}/usr/local/sbin:/usr/sbin:/sbin{os.pathsep}" \
                      f"{os.environ.get('PATH', '')}"
        return env

    def run_on(self, node: str, command: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
        """``command`` (a shell line) on ``node``, with the cluster's env and the venv, from this repository."""
        exports = {**self.env(), "OMP_NUM_THREADS": "1", **env}
        line = "cd {} && exec env {} sh -c {}".format(
            shlex.quote(str(REPO)), " ".join(shlex.quote(f"{k}={v}") for k, v in exports.items()),
            shlex.quote(command))
        return subprocess.run([str(self.module.HERE / "bin" / "nsexec"), node, line], capture_output=True,
                              text=True, timeout=timeout)

    def processes(self, node: str) -> list[str]:
        """Command lines of every process in ``node``'s own process table."""
        lines = []
        for pid in self.module.node_pids(node):
            try:
                lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
        return lines


REPO = Path(__file__).resolve().parent.parent
FAKE_PBS = Path(__file__).parent / "fakes" / "pbs"


@pytest.fixture(scope="session")
def cluster_session():
    """Starts the test cluster once (3 nodes), stops it at the end; nothing is left running."""
    need = [tool for tool in ("unshare", "nsenter", "ip") if not shutil.which(tool)]
    sbin = f"/usr/local/sbin:/usr/sbin:/sbin{os.pathsep}{os.environ.get('PATH', '')}"
    if not shutil.which("slurmctld", path=sbin) or not shutil.which("slurmd", path=sbin):
        need.append("slurmctld/slurmd (tests/slurm/start-slurm.sh installs them)")
    if os.geteuid() != 0:
        need.append("root")
    if need:
        if os.environ.get("PARSL_TORCH_REQUIRE_CLUSTER"):
            pytest.fail(f"PARSL_TORCH_REQUIRE_CLUSTER is set but the test cluster cannot start: "
                        f"missing {', '.join(need)}")
        pytest.skip(f"no multi-node test cluster: missing {', '.join(need)}")
    from .cluster import cluster as module

    with _one_suite_at_a_time():
        nodes = module.node_names(3)
        module.up(len(nodes))
        try:
            yield Cluster(module, nodes)
        finally:
            module.down(quiet=True)


@contextlib.contextmanager
def _one_suite_at_a_time():
    """The test cluster's bridge, addresses and Slurm ports are the machine's: a second suite that
    started it too would tear down the first's nodes mid-test. It says so and stops instead."""
    import fcntl

    path = Path(os.environ.get("PT_CLUSTER_DIR", "/tmp/pt-cluster")).with_suffix(".lock")
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            pytest.fail(f"another test suite on this machine (PID {lock.read().strip() or '?'}) is using the "
                        f"multi-node test cluster ({path}): run one suite with the multinode tests at a time, "
                        f"or this one with -m 'not multinode'")
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        yield


@pytest.fixture
def cluster(cluster_session, monkeypatch):
    """The running cluster with its env exported; a node lost by an earlier test is back."""
    for node in cluster_session.nodes:
        if not cluster_session.module.node_alive(node):
            cluster_session.module.restart_node(node)
    for key, value in cluster_session.env().items():
        monkeypatch.setenv(key, value)
    for key in [k for k in os.environ if (k in LAUNCHER_VARS or k.startswith(LAUNCHER_PREFIXES))
                and k != "SLURM_CONF"]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return cluster_session


@pytest.fixture
def plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stages and ``History.finalize`` draw their plots, as by default (the suite turns them off)."""
    monkeypatch.delenv("PARSL_TORCH_PLOTS", raising=False)
