"""``parsl-torch remote probe`` and ``parsl-torch endpoint test``: Globus Compute endpoints,
checked from here before anything depends on them."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import sites
from ..apps.stage.options import ShippedFunction, StageOptions
from ..apps.remote.client import make_executor, probe
from ..apps.stage.call import StageCall
from ..apps.remote.job import RemoteJob, run_job
from ..common import settings
from ..stages.smoke import smoke
from ..sites.build import interface_address
from ..sites.endpoint import endpoint_config
from ..sites.engine import LocalEndpoint


def _remote_probe(args: argparse.Namespace) -> int:
    """Versions on the endpoint against these; warnings for the mismatches."""
    executor = make_executor(args.endpoint)
    try:
        remote, warnings = probe(executor)
    finally:
        executor.shutdown(wait=False)
    for name, version in sorted(remote.items()):
        print(f"{name:>20}: {version}")
    for warning in warnings:
        print(f"parsl-torch: warning: {warning}", file=sys.stderr)
    return 1 if warnings else 0


def _say(ok: bool, what: str) -> None:
    print(f"{'ok' if ok else 'FAILED'}: {what}", flush=True)


def _endpoint_test(args: argparse.Namespace) -> int:
    """The site's endpoint config through the endpoint's own loader and engine, started here, and a
    2-rank smoke stage through it as a workflow's stage goes (``apps.remote.job``): what
    ``globus-compute-endpoint start`` would run, minus the service."""
    site = sites.load(args.site, account=args.account, queue=args.queue, walltime=args.walltime, nodes=args.nodes)
    interface_address(site.spec)  # off the machine: one line naming the interface, not the engine's traceback
    config = endpoint_config(site.spec, args.python_env or sys.prefix)  # (a site it refuses leaves no folder)
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix=f"parsl-torch-endpoint-{site.name}-")).absolute()
    endpoint = LocalEndpoint(config, run_dir / "engine")
    _say(True, f"site {site.name}: the endpoint's loader built {endpoint.description}")
    stage_dir = run_dir / "smoke"
    env = {settings.RUN_DIR.name: str(run_dir), settings.STAGE_DIR.name: str(stage_dir), **site.rank_env()}
    opts = StageOptions(str(stage_dir), 1, args.ranks, args.timeout, tuple(env.items()),
                        site.launcher_args(args.ranks))
    spec = {"num_nodes": 1, "ranks_per_node": args.ranks, "num_ranks": args.ranks}
    call = StageCall(opts, "endpoint", tuple(spec.items()), fn=ShippedFunction.of(smoke))
    job = RemoteJob(call, code=(), memoize=False)
    t0 = time.monotonic()
    with endpoint:
        _say(True, f"engine started in {time.monotonic() - t0:.1f} s (run directory {run_dir})")
        t1 = time.monotonic()
        try:
            answer = endpoint.submit(run_job, job, str(stage_dir / "smoke.h5"), resource_specification=spec)
            summary: dict[str, Any] = answer.result(timeout=args.timeout).result()
        except Exception as exc:  # noqa: BLE001 - every failure is the test's answer, said in one place
            _say(False, f"{args.ranks}-rank smoke stage: {type(exc).__name__}: {exc}")
            return 1
    expected = args.ranks * (args.ranks + 1) / 2
    good = summary.get("world_size") == args.ranks and summary.get("sum") == expected and Path(
        summary.get("history", "")).is_file()
    _say(good, f"{args.ranks}-rank smoke stage in {time.monotonic() - t1:.1f} s: all_reduce sum "
               f"{summary.get('sum')} (expected {expected:g}) over {summary.get('world_size')} ranks "
               f"({summary.get('backend')}), history {summary.get('history')}, launched with "
               f"{' '.join(opts.launcher_args) or 'no binding flags'}")
    if good:
        print(f"the endpoint config works: parsl-torch sites endpoint-config {site.name} ... > "
              f"~/.globus_compute/<name>/config.yaml, then globus-compute-endpoint start <name>")
    return 0 if good else 1


def add_commands(sub: Any) -> None:
    remote = sub.add_parser("remote", help="Globus Compute endpoints").add_subparsers(dest="action", required=True)
    probe_cmd = remote.add_parser("probe", help="versions on an endpoint vs here; exit 1 on mismatches")
    probe_cmd.add_argument("--endpoint", required=True, help="the endpoint's UUID")
    probe_cmd.set_defaults(func=_remote_probe)

    endpoint = sub.add_parser("endpoint", help="Globus Compute endpoint configs").add_subparsers(
        dest="action", required=True)
    test = endpoint.add_parser("test", help="start a site's endpoint engine here and run a 2-rank smoke stage "
                                            "through it; exit 1 if it fails")
    test.add_argument("site", help="site name (its endpoint config is rendered as sites endpoint-config does)")
    test.add_argument("--account")
    test.add_argument("--queue", help="PBS queue or Slurm partition")
    test.add_argument("--walltime", help="HH:MM:SS")
    test.add_argument("--nodes", type=int, help="nodes per block")
    test.add_argument("--python-env", help="the environment the endpoint's workers use (default: this one)")
    test.add_argument("--ranks", type=int, default=2, help="ranks of the smoke stage (default 2)")
    test.add_argument("--timeout", type=float, default=1800,
                      help="seconds to wait for the stage, queue time included (default 1800)")
    test.add_argument("--run-dir", help="where the engine and the smoke stage write (default: a new temp dir)")
    test.set_defaults(func=_endpoint_test)
