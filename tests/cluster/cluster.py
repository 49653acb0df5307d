#!/usr/bin/env python3
"""A multi-node test cluster on one machine (TEST HARNESS, not part of the package).

    python3 tests/cluster/cluster.py up [--nodes N]   # start; prints the env file to source
    python3 tests/cluster/cluster.py status
    python3 tests/cluster/cluster.py exec NODE -- CMD...
    python3 tests/cluster/cluster.py down             # stop everything it started

Each node (n1, n2, ...) is a set of Linux namespaces made with ``unshare``
(network, UTS, PID, mount): its own hostname, its own address on a private
bridge (no default route, an empty resolv.conf: traffic stays on the bridge),
its own /etc/hosts and its own process table. The file system is the
machine's own, shared by all nodes as a parallel file system is. Needs root.

On it:
* Slurm: ``slurmctld`` on the host side (its own port and state, beside any
  one-node Slurm), one ``slurmd`` in each node.
* FAKE PBS (tests/fakes/pbs, with ``FAKE_PBS_NODES`` set): qsub starts the job
  script on the first node of an allocation.
* ``nsexec`` (execd.py), ssh's stand-in: hydra's mpiexec reaches the other
  nodes with ``HYDRA_LAUNCHER=ssh HYDRA_LAUNCHER_EXEC=.../nsexec``, as PALS
  does with its own daemons on Aurora and Polaris.
* ``UCX_TLS=tcp``: MPICH's UCX shared-memory transports assume one host, and
  these nodes share one kernel (a fact of this harness, not of any site).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STATE = Path(os.environ.get("PT_CLUSTER_DIR", "/tmp/pt-cluster"))
#: each node's own storage (a node-local disk): the node's directory bind-mounted here in its namespace
NODE_LOCAL = Path("/var/tmp/pt-nodelocal")
BRIDGE = "ptbr0"
SUBNET = "10.77.0"
HOST_ADDR = f"{SUBNET}.1"
CTLD_PORT = 6827  # beside start-slurm.sh's one-node cluster (6817)
EXEC_PORT = 7022
PBS_FAKES = HERE.parent / "fakes" / "pbs"


def node_names(n: int) -> list[str]:
    return [f"n{i}" for i in range(1, n + 1)]


def node_addr(name: str) -> str:
    return f"{SUBNET}.{10 + int(name[1:])}"


SBIN_PATH = f"/usr/local/sbin:/usr/sbin:/sbin:{os.environ.get('PATH', '/usr/bin:/bin')}"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, env={**os.environ, "PATH": SBIN_PATH})


def _kill(pid: int, marker: str, sig: int = signal.SIGKILL) -> None:
    """Signal ``pid`` only if it is still ours (its command line mentions ``marker``): PIDs are reused."""
    try:
        if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, sig)
    except OSError:
        pass


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def env_lines(nodes: list[str]) -> dict[str, str]:
    return {
        "PT_CLUSTER_DIR": str(STATE),
        "PT_CLUSTER_NODES": ",".join(nodes),
        "PT_CLUSTER_SLURM_CONF": str(STATE / "slurm" / "slurm.conf"),
        "FAKE_PBS_DIR": str(STATE / "pbs"),
        "FAKE_PBS_NODES": ",".join(nodes),
        "FAKE_PBS_EXEC": str(HERE / "bin" / "nsexec"),
        "HYDRA_LAUNCHER": "ssh",
        "HYDRA_LAUNCHER_EXEC": str(HERE / "bin" / "nsexec"),
        "UCX_TLS": "tcp",
    }


def _slurm_conf(nodes: list[str]) -> str:
    slurm = STATE / "slurm"
    auth = "none" if Path("/usr/lib/x86_64-linux-gnu/slurm-wlm/auth_none.so").exists() else "munge"
    if auth == "munge":
        raise SystemExit("cluster: Slurm's auth_none plugin is missing (install slurm-wlm-basic-plugins)")
    cpus = max(os.cpu_count() or 4, 4)  # nodes share the machine's cores: 4 ranks per node must fit
    node_lines = "\n".join(f"NodeName={n} NodeAddr={node_addr(n)} CPUs={cpus} RealMemory=4000 State=UNKNOWN"
                           for n in nodes)
    return f"""# written by tests/cluster/cluster.py (test harness)
ClusterName=ptcluster
SlurmctldHost={socket.gethostname().split('.')[0]}({HOST_ADDR})
SlurmctldPort={CTLD_PORT}
SlurmdPort=6818
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={slurm}/ctld
SlurmdSpoolDir={slurm}/d-%n
SlurmctldPidFile={slurm}/slurmctld.pid
SlurmdPidFile={slurm}/slurmd-%n.pid
SlurmctldLogFile={slurm}/slurmctld.log
SlurmdLogFile={slurm}/slurmd-%n.log
MailProg=/bin/true
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmi2
ReturnToService=2
SlurmctldTimeout=30
# a lost node is DOWN within ~20 s (Slurm's default: 5 min): the retries of the node-loss tests wait for it
SlurmdTimeout=20
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
{node_lines}
PartitionName=debug Nodes={",".join(nodes)} Default=YES MaxTime=INFINITE State=UP
"""


def _start_node(name: str, nodes: list[str], with_slurm: bool) -> int:
    node_dir = STATE / "nodes" / name
    node_dir.mkdir(parents=True)
    shutil.copy(STATE / "hosts", node_dir / "hosts")
    (node_dir / "resolv.conf").write_text("")  # no name servers: look-ups fail at once, never stall
    daemons = [[sys.executable, str(HERE / "execd.py"), "serve", str(EXEC_PORT)]]
    if with_slurm:
        daemons.append(["slurmd", "-D", "-N", name, "-f", str(STATE / "slurm" / "slurm.conf")])
    (node_dir / "local").mkdir()
    NODE_LOCAL.mkdir(parents=True, exist_ok=True)
    spec = {"name": name, "node_dir": str(node_dir), "daemons": daemons,
            "path": SBIN_PATH, "node_local": [str(node_dir / "local"), str(NODE_LOCAL)]}
    (node_dir / "spec.json").write_text(json.dumps(spec))
    log = open(node_dir / "init.log", "wb")
    unshare = subprocess.Popen([shutil.which("unshare", path=SBIN_PATH) or "unshare", "--net", "--uts", "--pid",
                                "--mount", "--fork", "--mount-proc", "--kill-child", sys.executable,
                                str(HERE / "node_init.py"), str(node_dir / "spec.json")],
                               stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    init_pid = None
    (node_dir / "unshare.pid").write_text(str(unshare.pid))
    for _ in range(200):
        children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children")
        if children.exists() and children.read_text().split():
            init_pid = int(children.read_text().split()[0])
            break
        time.sleep(0.02)
    if init_pid is None:
        raise SystemExit(f"cluster: node {name} did not start: {(node_dir / 'init.log').read_text()}")
    (node_dir / "init.pid").write_text(str(init_pid))
    (node_dir / "unshare.pid").write_text(str(unshare.pid))
    veth = f"pt-{name}"
    sh("ip", "link", "del", veth, check=False)  # a dead node's pair goes away only when the kernel gets to it
    # a fixed MAC per node: a restarted node is found at once through the others' ARP caches
    mac = f"02:77:00:00:00:{int(name[1:]):02x}"
    sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "address", mac, "netns", str(init_pid))
    sh("ip", "link", "set", veth, "master", BRIDGE, "up")
    ns = ("nsenter", "-t", str(init_pid), "-n")
    sh(*ns, "ip", "link", "set", "lo", "up")
    sh(*ns, "ip", "addr", "add", f"{node_addr(name)}/24", "dev", "eth0")
    sh(*ns, "ip", "link", "set", "eth0", "up")
    (node_dir / "network-ready").write_text("")
    return init_pid


def up(n: int, with_slurm: bool = True) -> None:
    if (STATE / "cluster.json").exists():
        down(quiet=True)
    if os.geteuid() != 0:
        raise SystemExit("cluster: needs root (unshare, ip link)")
    nodes = node_names(n)
    STATE.mkdir(parents=True, exist_ok=True)
    for sub in ("nodes", "slurm", "pbs"):
        shutil.rmtree(STATE / sub, ignore_errors=True)
        (STATE / sub).mkdir()
    host = socket.gethostname().split(".")[0]
    (STATE / "hosts").write_text("127.0.0.1 localhost\n" + f"{HOST_ADDR} {host}\n"
                                 + "".join(f"{node_addr(x)} {x}\n" for x in nodes))
    sh("ip", "link", "del", BRIDGE, check=False)
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{HOST_ADDR}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    record: dict = {"nodes": nodes, "bridge": BRIDGE, "init": {}, "slurmctld": None}
    if with_slurm:
        if not shutil.which("slurmctld", path=SBIN_PATH):
            raise SystemExit("cluster: slurmctld not found: run tests/slurm/start-slurm.sh once "
                             "(it installs Debian's Slurm packages)")
        (STATE / "slurm" / "ctld").mkdir()
        (STATE / "slurm" / "slurm.conf").write_text(_slurm_conf(nodes))
        ctld = subprocess.Popen(["slurmctld", "-D", "-f", str(STATE / "slurm" / "slurm.conf")],
                                stdin=subprocess.DEVNULL, stdout=open(STATE / "slurm" / "slurmctld.out", "wb"),
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PATH": SBIN_PATH})
        record["slurmctld"] = ctld.pid
    (STATE / "cluster.json").write_text(json.dumps(record))
    try:
        for name in nodes:
            record["init"][name] = _start_node(name, nodes, with_slurm)
            (STATE / "cluster.json").write_text(json.dumps(record))
        (STATE / "cluster.env").write_text("".join(f"export {k}={v}\n" for k, v in env_lines(nodes).items()))
        _wait_ready(nodes, with_slurm)
    except BaseException:
        down(quiet=True)  # a half-started cluster leaves nothing behind either
        raise


def _wait_ready(nodes: list[str], with_slurm: bool, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    env = {**os.environ, "SLURM_CONF": str(STATE / "slurm" / "slurm.conf"), "PATH": SBIN_PATH}
    pending = set(nodes)
    while pending and time.monotonic() < deadline:
        for name in sorted(pending):
            try:
                socket.create_connection((node_addr(name), EXEC_PORT), timeout=1).close()
                pending.discard(name)
            except OSError:
                pass
        time.sleep(0.1)
    while with_slurm and not pending and time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        if all(states.get(x, "").rstrip("*") in ("idle", "mix", "alloc") for x in nodes):
            return
        for x in nodes:
            if states.get(x, "").startswith(("down", "drain")):
                subprocess.run(["scontrol", "update", f"nodename={x}", "state=resume"], env=env,
                               capture_output=True)
        time.sleep(0.25)
    if pending or with_slurm:
        raise SystemExit(f"cluster: nodes not ready after {timeout:g} s (exec daemon: {sorted(pending)}); "
                         f"see {STATE}/nodes/*/daemons.log and {STATE}/slurm/*.log")


def node_init_pid(name: str) -> int:
    return int((STATE / "nodes" / name / "init.pid").read_text())


def node_pids(name: str) -> list[int]:
    """Host PIDs of every process in the node (its own process table, seen from the host)."""
    ns = os.readlink(f"/proc/{node_init_pid(name)}/ns/pid")
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "pid") == ns:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def node_alive(name: str) -> bool:
    """The node's PID 1 runs (and is ours: a lost node's PID may have been reused by then)."""
    try:
        pid = node_init_pid(name)
        return _alive(pid) and b"node_init.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False


def lose_node(name: str) -> None:
    """Lose a node as a powered-off node is lost: its link goes down first (no
    resets reach anyone), then its PID 1 is killed (everything in it ends)."""
    sh("ip", "link", "set", f"pt-{name}", "down")
    _kill(node_init_pid(name), "node_init.py")


def restart_node(name: str) -> None:
    """A lost node comes back (a replaced node with the same name)."""
    record = json.loads((STATE / "cluster.json").read_text())
    if node_alive(name):
        _kill(node_init_pid(name), "node_init.py")
    for _ in range(100):
        if not node_alive(name):
            break
        time.sleep(0.05)
    sh("ip", "link", "del", f"pt-{name}", check=False)
    shutil.rmtree(STATE / "nodes" / name, ignore_errors=True)
    with_slurm = bool(record.get("slurmctld"))
    record["init"][name] = _start_node(name, record["nodes"], with_slurm)
    (STATE / "cluster.json").write_text(json.dumps(record))
    _wait_ready([name], with_slurm, timeout=120)  # (another node may still be down: restarted next)


def down(quiet: bool = False) -> None:
    """Stop everything ``up`` started: fake PBS jobs, nodes (SIGKILL of PID 1; their storage goes, their logs
    stay), slurmctld, the bridge."""
    record_file = STATE / "cluster.json"
    record = json.loads(record_file.read_text()) if record_file.exists() else {"init": {}, "slurmctld": None}
    for pid_file in (STATE / "pbs").glob("*.runner") if (STATE / "pbs").exists() else ():
        with contextlib.suppress(OSError, ValueError):  # a runner that ended long ago: its PID may be another's
            pid = int(pid_file.read_text())
            if b"fakepbs.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.killpg(pid, signal.SIGKILL)
    for pid in record["init"].values():
        _kill(pid, "node_init.py")
    for node_dir in (STATE / "nodes").glob("*") if (STATE / "nodes").exists() else ():
        for pid_file in ("init.pid", "unshare.pid"):  # unshare --kill-child takes its node along
            try:
                _kill(int((node_dir / pid_file).read_text()), "node_init.py")
            except (OSError, ValueError):
                pass
    if record.get("slurmctld"):
        _kill(record["slurmctld"], "slurmctld", signal.SIGTERM)
        for _ in range(50):
            if not _alive(record["slurmctld"]):
                break
            time.sleep(0.1)
        _kill(record["slurmctld"], "slurmctld")
    for node_dir in (STATE / "nodes").glob("*") if (STATE / "nodes").exists() else ():
        shutil.rmtree(node_dir / "local", ignore_errors=True)  # its own storage: a Python copy is 1.8 GB
    for name in record.get("nodes", []):
        sh("ip", "link", "del", f"pt-{name}", check=False)
    sh("ip", "link", "del", BRIDGE, check=False)
    record_file.unlink(missing_ok=True)
    if not quiet:
        print(f"cluster: down ({len(record['init'])} node(s) stopped)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cluster.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="start the cluster")
    p_up.add_argument("--nodes", type=int, default=2)
    p_up.add_argument("--no-slurm", action="store_true")
    sub.add_parser("down", help="stop everything up started")
    sub.add_parser("status", help="nodes and their processes")
    p_exec = sub.add_parser("exec", help="run a command on a node")
    p_exec.add_argument("node")
    p_exec.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.cmd == "up":
        t0 = time.monotonic()
        up(args.nodes, with_slurm=not args.no_slurm)
        print(f"cluster: {args.nodes} node(s) up in {time.monotonic() - t0:.1f} s; "
              f"source {STATE / 'cluster.env'}")
    elif args.cmd == "down":
        down()
    elif args.cmd == "status":
        if not (STATE / "cluster.json").exists():
            print(f"cluster: none running (no {STATE / 'cluster.json'})")
            return 1
        record = json.loads((STATE / "cluster.json").read_text())
        for name in record["nodes"]:
            state = f"processes={len(node_pids(name))}" if node_alive(name) else "DOWN"
            print(f"{name} {node_addr(name)} init={node_init_pid(name)} {state}")
    else:
        sys.path.insert(0, str(HERE))
        from execd import run

        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return run(args.node, command)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
