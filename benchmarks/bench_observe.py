"""What observing a stage's reads costs (``observe.recorder``), against the same work unobserved,
measured in the same run:

1. what observing adds to each file a process opens: 20,000 opens and reads of small shards in a
   fresh interpreter, not observed, observed by the audit hooks alone, and by the hooks and the
   preloaded observer of compiled code (``observe.native``), interleaved; through Python's ``open`` and
   through the C library's (``open``/``read``/``close`` called by compiled code, here through ctypes:
   the preloaded observer alone sees those; goal: <= 2 us each); and that cost against a training-like
   step that reads one shard beside a matmul (goal: observing adds <= 1 % of the step);
2. a file new to the process opened by compiled code (each of 10,000 once; goal <= 2 us), ``cat`` of 2,000
   files (goal <= 1.2x) and a ``posix_spawn`` from Python, observed against not;
3. the skip check over 10,000 observed files (100 folders of 100), when nothing changed: the
   digests are stat-cached, as in a rerun (goal: <= 0.5 s), and the same check the first time
   (every file hashed).

usage: python benchmarks/bench_observe.py [--steps 300] [--files 10000] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import bench_env

LOOP = """
import ctypes, os, sys, time
import torch
shards, steps, compute, compiled = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "c"
libc = ctypes.CDLL(None, use_errno=True)
buffer = ctypes.create_string_buffer(8192)
names = [os.fsencode(f"{shards}/s{i}.bin") for i in range(int(os.environ.get("BENCH_DISTINCT", "1000")))]
a = torch.randn(384, 384)
for i in range(10):
    a @ a
t0 = time.perf_counter()
for i in range(steps):
    if compiled:  # (as a compiled loader opens its file: the C library's open, not Python's)
        fd = libc.open(names[i % len(names)], os.O_RDONLY)
        libc.read(fd, buffer, 8192)
        libc.close(fd)
    else:
        with open(names[i % len(names)], "rb") as f:
            f.read()
    if compute:
        a @ a @ a
print((time.perf_counter() - t0) / steps)
"""
#: how a process is observed: not at all, by the audit hooks alone, by them and the preloaded library
MODES = ("plain", "hooks", "hooks+preload")


def observed_env(reads: Path | None, mode: str, program: str = sys.executable) -> dict[str, str]:
    """What a rank's shim gives a process observed as ``mode`` (``MODES``)."""
    from parsl_torch.launch.shim import observing_env

    extra = observing_env(str(reads), os.environ, [program]) if mode != "plain" else {}
    if mode == "hooks":
        extra.pop("LD_PRELOAD", None)
    return extra


def step_time(shards: Path, steps: int, reads: Path | None, mode: str, compute: bool = True,
              compiled: bool = False, distinct: int = 1000) -> float:
    out = subprocess.run([sys.executable, "-c", LOOP, str(shards), str(steps), "1" if compute else "0",
                          "c" if compiled else "p"], capture_output=True, text=True,
                         env=bench_env(TMPDIR=str(shards.parent / "tmp"), BENCH_DISTINCT=str(distinct),
                                       **observed_env(reads, mode)), check=True)
    return float(out.stdout.split()[-1])


SPAWN = """
import os, sys, time
t0 = time.perf_counter()
for _ in range(int(sys.argv[1])):
    os.waitpid(os.posix_spawn("/bin/true", ["true"], os.environ), 0)
print((time.perf_counter() - t0) / int(sys.argv[1]))
"""


def programs(root: Path, shards: Path, reps: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """``cat`` of 2,000 files (its whole process, observed by the preloaded library or not), and a
    ``posix_spawn`` of ``/bin/true`` from Python (each of 200), interleaved."""
    files = [str(shards / f"s{i}.bin") for i in range(2000)]
    cat: dict[str, list[float]] = {"plain": [], "hooks+preload": []}
    spawn: dict[str, list[float]] = {"plain": [], "hooks+preload": []}
    for rep in range(reps):
        for mode in cat:
            reads = root / f"reads-cat-{rep}-{mode}"
            reads.mkdir()
            env = bench_env(TMPDIR=str(root / "tmp"), **observed_env(reads, mode, "cat"))
            t0 = time.perf_counter()
            subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, env=env, check=True)
            cat[mode].append(time.perf_counter() - t0)
            reads = root / f"reads-spawn-{rep}-{mode}"
            reads.mkdir()
            out = subprocess.run([sys.executable, "-c", SPAWN, "200"], capture_output=True, text=True, check=True,
                                 env=bench_env(TMPDIR=str(root / "tmp"), **observed_env(reads, mode)))
            spawn[mode].append(float(out.stdout.split()[-1]))
    return cat, spawn


def skip_check(root: Path, files: int) -> tuple[float, float]:
    from parsl_torch.apps.identity.digests import DigestCache
    from parsl_torch.apps.identity.reads import current, read_digests
    from parsl_torch.apps.identity.verdict import stale_reads
    from parsl_torch.common import stagedir

    lines = []
    for d in range(files // 100):
        folder = root / f"d{d}"
        folder.mkdir()
        for i in range(100):
            (folder / f"f{i}.bin").write_bytes(os.urandom(256))
            os.utime(folder / f"f{i}.bin", (time.time() - 3600,) * 2)  # (a file written just now is hashed again)
            lines.append(f"f {folder / f'f{i}.bin'}")
    stage = root / "runs" / "stage"
    stage.mkdir(parents=True)
    cache = DigestCache(root / "digests.json")
    t0 = time.perf_counter()
    before = read_digests(stagedir.ReadsRecord(1, 1, lines), str(stage), {}, cache)
    first = time.perf_counter() - t0
    cache.save()
    cache = DigestCache(root / "digests.json")  # a rerun: a new process, the run's digest cache on disk
    t0 = time.perf_counter()
    assert not stale_reads(stagedir.CallRecord("k", {}, {}, before), str(stage), {}, cache)
    check = time.perf_counter() - t0
    assert len(current(before, str(stage), {}, cache)) == files
    return first, check


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--files", type=int, default=10_000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--distinct", type=int, default=10_000, help="files new to the process, each opened once")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(dir=os.getcwd(), prefix=".bench-observe-") as tmp:
        root = Path(tmp)
        (root / "tmp").mkdir()
        shards = root / "shards"
        shards.mkdir()
        for i in range(max(2000, args.distinct)):
            (shards / f"s{i}.bin").write_bytes(os.urandom(4096))
        times: dict[tuple[str, bool], list[float]] = {(m, c): [] for m in MODES for c in (False, True)}
        fresh: dict[str, list[float]] = {m: [] for m in MODES}  # each file new to the process
        steps = []
        for rep in range(args.reps):  # interleaved: drift hits all alike
            for (mode, compiled), found in times.items():
                reads = root / f"reads-{rep}-{mode}-{compiled}"
                reads.mkdir()
                found.append(step_time(shards, 20_000, reads, mode, compute=False, compiled=compiled))
            for mode, found in fresh.items():
                reads = root / f"reads-new-{rep}-{mode}"
                reads.mkdir()
                found.append(step_time(shards, args.distinct, reads, mode, compute=False, compiled=True,
                                       distinct=args.distinct))
            steps.append(step_time(shards, args.steps, None, "plain"))
        cat, spawn = programs(root, shards, args.reps)
        med = {key: statistics.median(found) for key, found in times.items()}
        step = statistics.median(steps)
        for compiled, how in ((False, "Python's open"), (True, "the C library's open (compiled code)")):
            plain = med["plain", compiled]
            print(f"a file opened and read through {how}: plain {plain * 1e6:.1f} us; "
                  + "; ".join(f"{m} {med[m, compiled] * 1e6:.1f} us ({(med[m, compiled] - plain) * 1e6:+.1f} us)"
                              for m in MODES[1:]) + f" ({args.reps} interleaved runs of 20,000)")
        new = {m: statistics.median(found) for m, found in fresh.items()}
        print(f"a file new to the process opened and read by compiled code: plain {new['plain'] * 1e6:.1f} us; "
              f"observed {new['hooks+preload'] * 1e6:.1f} us ({(new['hooks+preload'] - new['plain']) * 1e6:+.1f} us, "
              f"{new['hooks+preload'] / new['plain']:.2f}x; {args.reps} interleaved runs of {args.distinct:,} files)")
        cats = {m: statistics.median(found) for m, found in cat.items()}
        spawns = {m: statistics.median(found) for m, found in spawn.items()}
        print(f"cat of 2,000 files: plain {cats['plain'] * 1e3:.1f} ms, observed {cats['hooks+preload'] * 1e3:.1f} ms "
              f"({cats['hooks+preload'] / cats['plain']:.2f}x); a posix_spawn of /bin/true from Python: plain "
              f"{spawns['plain'] * 1e3:.2f} ms, observed {spawns['hooks+preload'] * 1e3:.2f} ms "
              f"({(spawns['hooks+preload'] - spawns['plain']) * 1e3:+.2f} ms)")
        added = med["hooks+preload", False] - med["plain", False]
        below = med["hooks+preload", True] - med["plain", True]
        print(f"a step reading one shard beside a 384x384 matmul chain takes {step * 1e3:.2f} ms: observing adds "
              f"{added / step:.2%} of it (through Python's open), {below / step:.2%} (through compiled code)")
        (root / "check").mkdir()
        first, check = skip_check(root / "check", args.files)
        print(f"skip check over {args.files} observed files, nothing changed: {check:.3f} s "
              f"(first digest of them, every file hashed: {first:.3f} s)")
        print(json.dumps({"added_per_read_us": round(added * 1e6, 2), "added_per_compiled_read_us":
                          round(below * 1e6, 2), "added_per_new_file_us": round((new["hooks+preload"] - new["plain"])
                                                                                * 1e6, 2),
                          "cat_ratio": round(cats["hooks+preload"] / cats["plain"], 3), "step_share": round(added / step, 5),
                          "check_s": round(check, 4)}))


if __name__ == "__main__":
    main()
