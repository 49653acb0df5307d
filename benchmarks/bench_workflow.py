"""A train stage through the workflow (Parsl, local site) against the same
stage module under bare ``mpiexec -n 2``, in the same run (target <= 1.05x
for a ~60 s stage), the fixed overhead, and the time to rerun the finished
workflow (every stage skipped). A third run sends the same command through a
bare Parsl MPIExecutor (no parsl-torch, the local site's settings), to split
the overhead into Parsl's own and what parsl-torch adds on top.

usage: python benchmarks/bench_workflow.py [--steps 3000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import yaml
from common import BIN, bench_env, timed

WORKFLOW = """
import sys, parsl_torch as pt
from parsl_torch.stages.train import train
with pt.workflow(site="local", run_dir=sys.argv[2]):
    print(train(sys.argv[1], ranks_per_node=2).result()["final_loss"])
"""

# What a Parsl user writes by hand for the same stage on a laptop
BARE_PARSL = """
import sys, parsl
from parsl import bash_app
from parsl.config import Config
from parsl.executors import MPIExecutor
from parsl.launchers import SimpleLauncher
from parsl.providers import LocalProvider

init = (f'export PATH={sys.prefix}/bin:$PATH; export PBS_NODEFILE=$(mktemp); hostname > $PBS_NODEFILE')
config = Config(executors=[MPIExecutor(max_workers_per_block=1, mpi_launcher="mpiexec", poll_period=100,
                                       provider=LocalProvider(launcher=SimpleLauncher(), worker_init=init))],
                strategy_period=0.5, usage_tracking=0, run_dir=sys.argv[2])

@bash_app
def train(config, out, parsl_resource_specification):
    import sys
    return (f"$PARSL_MPI_PREFIX {sys.executable} -m parsl_torch.stages.train "
            f"--config {config} --history {out}.h5 --checkpoint {out}.pt")

spec = {"num_nodes": 1, "ranks_per_node": 2, "num_ranks": 2}
with parsl.load(config):
    train(sys.argv[1], sys.argv[2] + "/train", parsl_resource_specification=spec).result()
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    env = bench_env(PARSL_TORCH_SCHEDULER="local")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        config = tmp / "train.yaml"
        config.write_text(yaml.safe_dump({"steps": args.steps, "checkpoint_every": 500, "log_every": 500}))
        script, parsl_script = tmp / "workflow.py", tmp / "bare_parsl.py"
        script.write_text(WORKFLOW)
        parsl_script.write_text(BARE_PARSL)
        bares, flows, parsls = [], [], []
        for rep in range(args.reps):  # alternate, so drift on a shared machine hits both alike
            bares.append(timed([str(BIN / "mpiexec"), "-n", "2", sys.executable, "-m", "parsl_torch.stages.train",
                                "--config", str(config), "--history", str(tmp / f"bare{rep}.h5"),
                                "--checkpoint", str(tmp / f"bare{rep}.pt")], env))
            flows.append(timed([sys.executable, str(script), str(config), str(tmp / f"run{rep}")], env))
            parsls.append(timed([sys.executable, str(parsl_script), str(config), str(tmp / f"parsl{rep}")], env))
        rerun = timed([sys.executable, str(script), str(config), str(tmp / "run0")], env)
        bare, flow, plain = statistics.median(bares), statistics.median(flows), statistics.median(parsls)
    print(f"train stage, {args.steps} steps on 2 ranks (median of {args.reps}): workflow {flow:.1f} s, bare mpiexec {bare:.1f} s -> "
          f"{flow / bare:.3f}x, fixed overhead {flow - bare:+.1f} s (target <= 1.05x)")
    print(f"  of which bare Parsl (MPIExecutor, same command): {plain:.1f} s -> {plain / bare:.3f}x of bare mpiexec, "
          f"{plain - bare:+.1f} s; parsl-torch on top of bare Parsl: {flow / plain:.3f}x, {flow - plain:+.1f} s")
    print(f"rerun of the finished workflow (stage skipped): {rerun:.1f} s")


if __name__ == "__main__":
    main()
