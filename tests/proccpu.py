"""CPU time by kind of process, for a command and everything it starts (Linux process accounting: root).

    python tests/proccpu.py -- .venv/bin/python -m pytest tests/test_workflow.py -k rerun_does_no_training

Prints the CPU seconds and the count of each kind of process (a rank, a workflow, Parsl's interchange,
its worker pool ...), then the costliest processes. The kernel writes a record for every process that
ends while accounting is on, whoever started it: run it on a machine not otherwise busy. What a
process is comes from its command line, read from /proc while it runs (one that lives less than the
20 ms between reads is named by its program alone).
"""

from __future__ import annotations

import collections
import ctypes
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time

#: (kind, what its command line holds), first match wins: what starts a rank names it in its own
KINDS = (("supervisor", "launch.supervise"), ("shim", "launch.shim"), ("rank", "stage_main"), ("rank", "warm.rank"),
         ("worker pool", "parsl-torch-pool"), ("pool's forkserver", "forkserver"), ("interchange", "interchange"),
         ("watchdog", "apps.session.watchdog"), ("parsl-torch (cli)", "bin/parsl-torch "))
RECORD = struct.Struct("<BBHIIIIIIfHH")  # acct_v3 up to ac_stime; ac_comm is bytes 48..64 of 64
SIZE, HZ = 64, 100


def _seconds(comp: int) -> float:
    """An ``acct_v3`` comp_t (13-bit mantissa, 3-bit base-8 exponent) in clock ticks, as seconds."""
    return ((comp & 0x1FFF) << (3 * (comp >> 13))) / HZ


def _watch(cmdlines: dict[int, str], done: threading.Event) -> None:
    while not done.is_set():
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    line = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            if line:
                cmdlines[int(pid)] = line  # (again each time: a fork execs a new program)
        time.sleep(0.02)


def kind(cmdline: str) -> str:
    words = cmdline.split(" ")
    if "pytest" in words[0].rsplit("/", 1)[-1] or words[1:3] == ["-m", "pytest"]:  # by its program alone: a
        return "pytest"  # test's workflow script runs from a folder under /tmp/pytest-of-...
    for name, marker in KINDS:
        if marker in cmdline:
            return name
    if cmdline.startswith(sys.executable) or "python" in words[0]:
        return "workflow script" if len(words) > 1 and words[1].endswith(".py") else "other python"
    return words[0].rsplit("/", 1)[-1]


def main(argv: list[str]) -> int:
    if argv[:1] != ["--"] or len(argv) < 2:
        sys.exit(__doc__)
    libc = ctypes.CDLL(None, use_errno=True)
    with tempfile.NamedTemporaryFile(prefix="proccpu-") as log:
        if libc.acct(log.name.encode()) != 0:
            sys.exit(f"process accounting: {os.strerror(ctypes.get_errno())} (it needs root)")
        cmdlines: dict[int, str] = {}
        done = threading.Event()
        watcher = threading.Thread(target=_watch, args=(cmdlines, done), daemon=True)
        watcher.start()
        start = time.monotonic()
        try:
            rc = subprocess.call(argv[1:])
            time.sleep(2)  # what the command left to end by itself (a pool told to stop)
        finally:
            libc.acct(None)
            done.set()
        data = log.read()
    rows = []
    for i in range(0, len(data) - SIZE + 1, SIZE):
        fields = RECORD.unpack_from(data, i)
        pid, utime, stime = fields[6], fields[10], fields[11]
        comm = data[i + 48:i + SIZE].split(b"\0")[0].decode(errors="replace")
        rows.append((_seconds(utime) + _seconds(stime), pid, cmdlines.get(pid, comm)))
    by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for cpu, _, line in rows:
        tally = by_kind[kind(line)]
        tally[0] += cpu
        tally[1] += 1
    total = sum(cpu for cpu, _, _ in rows)
    print(f"{total:.1f} s of CPU in {len(rows)} processes, {time.monotonic() - start:.1f} s of wall time "
          f"(exit {rc})")
    for name, (cpu, count) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        if cpu >= 0.05:
            print(f"{cpu:8.1f} s  {100 * cpu / max(total, 1e-9):3.0f} %  {count:5d}  {name}")
    print("the costliest processes:")
    for cpu, pid, line in sorted(rows, reverse=True)[:15]:
        print(f"{cpu:8.2f} s  {pid:7d}  {line[:110]}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
