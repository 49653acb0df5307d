"""FAKE PBS Pro, for tests only: no PBS server can be installed on the test
machines. ``qsub``, ``qstat`` and ``qdel`` in this folder call this module.

* qsub reads ``-l select=N``, ``-l walltime=H:M:S``, ``-o``/``-e``/``-N``
  from its arguments and the script's ``#PBS`` lines, queues the job (state
  Q) and prints its id. A detached runner waits for N free nodes of
  ``$FAKE_PBS_NODES`` (default: this host alone), then (state R) starts the
  script on the allocation's first node, with PBS_JOBID, PBS_NODEFILE,
  PBS_O_WORKDIR and the submitter's environment (as ``qsub -V``). Other
  nodes are reached with ``$FAKE_PBS_EXEC NODE COMMAND`` (ssh's calling
  convention; the test cluster's nsexec).
* Past its walltime, or on qdel, the job is killed; at its end every process
  carrying its PBS_JOBID is killed on every node of the allocation, as PBS's
  MoM does; the job becomes F with its Exit_status.
* ``qstat -x -f -F json IDS`` answers as PBS Pro does (without -x, finished
  jobs are unknown, exit 153).
State lives in ``$FAKE_PBS_DIR``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ.get("FAKE_PBS_DIR", "/tmp/fake-pbs"))
UNKNOWN_JOB = 153


@contextlib.contextmanager
def _locked():
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _job_file(job_id: str) -> Path:
    return STATE / f"{job_id}.json"


def _load(job_id: str) -> dict | None:
    try:
        return json.loads(_job_file(job_id).read_text())
    except (OSError, ValueError):
        return None


def _save(job: dict) -> None:
    tmp = _job_file(job["id"]).with_suffix(".tmp")
    tmp.write_text(json.dumps(job))
    tmp.replace(_job_file(job["id"]))


def _seconds(walltime: str) -> int:
    h, m, s = (int(x) for x in walltime.split(":"))
    return h * 3600 + m * 60 + s


def _nodes() -> list[str]:
    return [n for n in os.environ.get("FAKE_PBS_NODES", socket.gethostname()).split(",") if n]


def qsub(argv: list[str]) -> int:
    options: dict[str, str] = {"select": "1", "walltime": "01:00:00"}
    script = Path(argv[-1]).resolve()
    directives = [line[4:].strip() for line in script.read_text().splitlines() if line.startswith("#PBS")]
    words = [w for d in directives for w in shlex.split(d)] + argv[:-1]
    i = 0
    while i < len(words):
        flag, value = words[i], words[i + 1] if i + 1 < len(words) else ""
        i += 2 if flag in ("-l", "-o", "-e", "-N", "-q", "-A", "-S", "-m") else 1
        if flag == "-l":
            for part in value.split(","):
                key, _, val = part.partition("=")
                options[key] = val
        elif flag in ("-o", "-e", "-N", "-q", "-A"):
            options[flag] = value
    want = int(re.match(r"\d+", options["select"]).group())
    if want > len(_nodes()):
        print(f"qsub: Job violates queue and/or server resource limits (select={want}, "
              f"{len(_nodes())} nodes)", file=sys.stderr)
        return 188
    with _locked():
        counter = STATE / "counter"
        seq = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(seq))
    job_id = f"{seq}.fakepbs"
    (STATE / f"{job_id}.args").write_text(" ".join(argv))
    _save({"id": job_id, "job_state": "Q", "nodes_wanted": want, "walltime": _seconds(options["walltime"]),
           "script": str(script), "stdout": options.get("-o", f"{script}.o{seq}"),
           "stderr": options.get("-e", f"{script}.e{seq}"), "workdir": os.getcwd(),
           "queue": options.get("-q", "workq"), "env": dict(os.environ), "exec_host": [], "submitted": time.time()})
    # the runner stands in for the PBS server, which is nobody's child: it must not carry what
    # the submitting process marks its own children with (parsl-torch's workflow token)
    server_env = {k: v for k, v in os.environ.items() if k != "PARSL_TORCH_WORKFLOW"}
    runner = subprocess.Popen([sys.executable, __file__, "run", job_id], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                              env={**server_env, "FAKE_PBS_DIR": str(STATE)})
    (STATE / f"{job_id}.runner").write_text(str(runner.pid))
    print(job_id)
    return 0


def _on_node(node: str, command: str) -> list[str]:
    remote = os.environ.get("FAKE_PBS_EXEC")
    if remote and node != socket.gethostname():
        return [remote, node, command]
    return ["/bin/sh", "-c", command]


def _clean_up(job: dict) -> None:
    """Kill what the job left on its nodes (PBS's MoM does, by session)."""
    needle = shlex.quote(f"PBS_JOBID={job['id']}")
    sweep = (f"for p in /proc/[0-9]*; do [ $p = /proc/$$ ] && continue; "
             f"grep -qaz {needle} $p/environ 2>/dev/null && kill -9 ${{p#/proc/}}; done; true")
    for node in job["exec_host"]:
        subprocess.run(_on_node(node, sweep), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=30, check=False)


def run(job_id: str) -> int:
    """The detached runner of one job: queue, allocate, run, enforce walltime, clean up."""
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda s, _f: stop.append(s))
    while True:
        with _locked():
            job = _load(job_id)
            if job is None or job["job_state"] != "Q":
                return 0
            if stop:
                job.update(job_state="F", Exit_status=-1)
                _save(job)
                return 0
            others = [_load(f.stem) or {} for f in STATE.glob("*.json")]
            busy = {n for other in others if other.get("job_state") in ("R", "E") for n in other["exec_host"]}
            free = [n for n in _nodes() if n not in busy]
            if len(free) >= job["nodes_wanted"]:
                job.update(job_state="R", exec_host=free[:job["nodes_wanted"]], stime=time.time())
                _save(job)
                break
        time.sleep(0.2)
    nodefile = STATE / f"{job_id}.nodes"
    nodefile.write_text("".join(f"{n}\n" for n in job["exec_host"]))
    env = {**job["env"], "PBS_JOBID": job_id, "PBS_NODEFILE": str(nodefile), "PBS_O_WORKDIR": job["workdir"],
           "PBS_QUEUE": job["queue"], "PBS_ENVIRONMENT": "PBS_BATCH"}
    command = (f"cd {shlex.quote(job['workdir'])} && exec env -i "
               + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
               + f" /bin/bash {shlex.quote(job['script'])} >{shlex.quote(job['stdout'])} "
               f"2>{shlex.quote(job['stderr'])}")
    proc = subprocess.Popen(_on_node(job["exec_host"][0], command), stdin=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + job["walltime"]
    while proc.poll() is None and not stop and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        code = 271 if stop else -29  # PBS: killed by qdel (SIGTERM+256) / JOB_EXEC_KILL_WALLTIME
    else:
        code = proc.returncode
    with _locked():
        job = _load(job_id)
        job.update(job_state="E")
        _save(job)
    _clean_up(job)
    with _locked():
        job.update(job_state="F", Exit_status=code)
        _save(job)
    return 0


def qstat(argv: list[str]) -> int:
    history = "-x" in argv
    ids = [a for a in argv if not a.startswith("-") and a not in ("json",)]
    jobs, missing = {}, []
    for job_id in ids:
        job = _load(job_id)
        if job is None or (job["job_state"] == "F" and not history):
            missing.append(job_id)
            continue
        entry = {"Job_Name": Path(job["script"]).name, "job_state": job["job_state"], "queue": job["queue"],
                 "Resource_List": {"select": str(job["nodes_wanted"])}}
        if job["exec_host"]:
            entry["exec_host"] = "+".join(f"{n}/0" for n in job["exec_host"])
        if "Exit_status" in job:
            entry["Exit_status"] = job["Exit_status"]
        jobs[job_id] = entry
    if "json" in argv:
        print(json.dumps({"timestamp": int(time.time()), "pbs_version": "fake", "Jobs": jobs}))
    else:
        for job_id, entry in jobs.items():
            print(f"{job_id:<20} {entry['Job_Name'][:16]:<16} root  0 {entry['job_state']} {entry['queue']}")
    for job_id in missing:
        print(f"qstat: Unknown Job Id {job_id}", file=sys.stderr)
    return UNKNOWN_JOB if missing and not jobs else 0


def qdel(argv: list[str]) -> int:
    code = 0
    for job_id in [a for a in argv if not a.startswith("-")]:
        job = _load(job_id)
        if job is None or job["job_state"] == "F":
            print(f"qdel: Unknown Job Id {job_id}", file=sys.stderr)
            code = UNKNOWN_JOB
            continue
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((STATE / f"{job_id}.runner").read_text()), signal.SIGTERM)
    return code


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    sys.exit({"qsub": qsub, "qstat": qstat, "qdel": qdel, "run": run}[command](*([args] if command != "run"
                                                                                    else args)))
