"""What deciding a rerun costs: a stage's identity (its function, the 300 user modules it
reaches, a 1 GiB input file) computed cold (nothing cached: every module parsed, the input
hashed) and warm (a rerun in a new process: the run directory's digest cache), each in a
fresh interpreter, printed beside the plain baseline it adds to: a bare 2-rank start-up
(``mpiexec -n 2`` of ``setup_torch()``), measured in the same run. Goal: warm <= 2% of it.

usage: python benchmarks/bench_identity.py [--modules 300] [--gib 1] [--reps 3]
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

from common import BIN, bench_env, timed

MEASURE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import mod_0
from parsl.data_provider.files import File
from parsl_torch.apps import identity
from parsl_torch.apps.stage.call import StageCall
from parsl_torch.apps.identity.fingerprint import Fingerprinter
from parsl_torch.apps.stage.options import StageOptions

def stage(x, inputs=()):
    return mod_0.work(x)

t0 = time.perf_counter()
cache = identity.DigestCache.of_run_dir(sys.argv[2])
fp = Fingerprinter(strict=False)
code = fp.digest(stage, "stage")
opts = StageOptions(sys.argv[2] + "/stage", 1, 2, None, (), (), code=code, code_roots=tuple(sorted(fp.roots)),
                    files=tuple(sorted(fp.files)), env_reads=tuple(sorted(fp.env_names)), import_path=(sys.argv[1],))
parts = identity.stage_components(StageCall(opts, "mpi", ()), (3,), {"inputs": [File(sys.argv[3])], "outputs": []},
                                  cache)
took = time.perf_counter() - t0
print(json.dumps({"seconds": took, "modules": sum(k.startswith("module ") for k in parts)}))
"""


def make_project(root: Path, modules: int, gib: float) -> Path:
    for i in range(modules):  # a tree of imports (mod_i imports mod_2i+1 and mod_2i+2), 20 functions each
        kids = [k for k in (2 * i + 1, 2 * i + 2) if k < modules]
        imports = "".join(f"import mod_{k}\n" for k in kids)
        body = "".join(f"def f{j}(x):\n    return x * {j} + {i}\n\n" for j in range(20))
        calls = "".join(f"mod_{k}.work(x) + " for k in kids)
        (root / f"mod_{i}.py").write_text(f'"""module {i}"""\n{imports}\n{body}def work(x):\n    return {calls}f1(x)\n')
    data = root / "input.bin"
    chunk = os.urandom(1 << 20)
    with open(data, "wb") as f:
        for _ in range(int(gib * 1024)):
            f.write(chunk)
    for path in root.iterdir():  # written earlier, as a project's files are
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    return data


def measure(script: Path, project: Path, run_dir: Path, data: Path, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, str(script), str(project), str(run_dir), str(data)], env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modules", type=int, default=300)
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    env = bench_env()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        project = tmp / "proj"
        project.mkdir()
        data = make_project(project, args.modules, args.gib)
        script = tmp / "measure.py"
        script.write_text(MEASURE)
        colds, warms, starts = [], [], []
        for rep in range(args.reps):
            run_dir = tmp / f"run{rep}"
            (run_dir / "parsl").mkdir(parents=True)
            # a new mtime: the content is hashed again, as after a copy (a minute ago: one written within 2 s
            # of its hash is hashed again at the next call, not remembered)
            os.utime(data, (time.time() - 60 - rep, time.time() - 60 - rep))
            cold = measure(script, project, run_dir, data, env)
            colds.append(cold["seconds"])
            warms.append(measure(script, project, run_dir, data, env)["seconds"])
            starts.append(timed([str(BIN / "mpiexec"), "-n", "2", sys.executable, "-c",
                                 "import parsl_torch as pt; pt.setup_torch(); pt.cleanup()"], env))
        cold_s, warm_s, start = statistics.median(colds), statistics.median(warms), statistics.median(starts)
    print(f"stage identity, {cold['modules']} user modules + a {args.gib:g} GiB input (median of {args.reps}): "
          f"cold {cold_s:.2f} s, warm {warm_s * 1000:.1f} ms")
    print(f"bare 2-rank start-up (mpiexec -n 2, setup_torch): {start:.2f} s -> warm identity "
          f"{warm_s / start:.2%} of it (goal <= 2%), cold {cold_s / start:.2f}x")


if __name__ == "__main__":
    main()
