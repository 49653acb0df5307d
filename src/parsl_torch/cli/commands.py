"""The ``parsl-torch`` command.

User mistakes (any ParslTorchError) print one line and exit 2, no traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import runpy
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from .. import sites
from ..apps.session import status as run_status
from ..apps.sweeps import view as sweepview
from ..apps.session.request import RunFlags, run_flags
from ..common import settings
from ..common.blocks import duration_seconds
from ..common.environ import path_with_python_bin
from ..common.metadata import redact
from ..core.device import get_backend, get_torch_device_type
from ..core.topology import env_topology
from ..errors import ConfigError, ParslTorchError, StageError
from ..launch.machines import get_machine
from ..launch.plan import LaunchRequest, plan_launch
from ..launch.schedulers import all_launchers, keep_host_files
from ..launch.supervise import supervise
from ..sites.build import drain_period
from ..sites.endpoint import render_endpoint_config
from ..sites.schema import block_seconds
from . import file_cmds, remote_cmds
from .doctor import as_json, run_checks


def _info(args: argparse.Namespace) -> int:
    """What this process would be: topology, device and backend (no communication)."""
    device = get_torch_device_type()
    info = {**dataclasses.asdict(env_topology()), "device": device, "backend": get_backend(device)}
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for key, value in info.items():
            print(f"{key:>17}: {value}")
    return 0


def _launch(args: argparse.Namespace) -> int:
    """Start the ranks with the right launcher for this scheduler and machine."""
    settings.check_user_settings()
    command = [sys.executable, "-m", args.module, *args.command] if args.module else list(args.command)
    if args.timeout is not None and not 0 < args.timeout < math.inf:
        raise ConfigError(f"--timeout {args.timeout:g}: give the seconds before every rank is stopped, > 0")
    deadline = {settings.DEADLINE.name: f"{time.time() + duration_seconds(args.deadline, '--deadline'):.3f}"} \
        if args.deadline else {}
    request = LaunchRequest(tuple(command), args.n, args.ppn, args.nodes, args.launcher)
    detection = sites.detect_job()
    plan = plan_launch(request, detection)
    # the site file's environment (oneCCL on Aurora, NCCL on Frontier...) reaches the ranks here too
    plan = dataclasses.replace(plan, env={**sites.rank_environment(), **plan.env, **deadline})
    shown = " ".join([*(f"{k}={v}" for k, v in plan.env.items()), shlex.join(plan.argv)])
    if args.dry_run:
        keep_host_files()  # (the command names them)
        print(shown)
        return 0
    print(f"parsl-torch: {plan.num_ranks} rank(s) on {plan.num_nodes} node(s) via {plan.launcher} "
          f"({detection.reason}): {shown}", file=sys.stderr, flush=True)
    return supervise(plan, timeout=args.timeout)


def _doctor(args: argparse.Namespace) -> int:
    """Environment checks with remedies; exit 1 if any is an error."""
    results = run_checks(smoke=not args.no_smoke)
    if args.json:
        print(json.dumps(as_json(results), indent=2))
    else:
        width = max(len(r.name) for r in results)
        for r in results:
            print(f"[{r.status.upper():>5}] {r.name:<{width}}  {r.detail}")
            if r.remedy and r.status in ("warn", "error"):
                print(f"{'':>8} {'':<{width}}  -> {r.remedy}")
    return 1 if any(r.status == "error" for r in results) else 0


def _load_site(args: argparse.Namespace) -> sites.Site:
    return sites.load(args.site, account=args.account, queue=args.queue, walltime=args.walltime,
                      nodes=args.nodes)


def _sites_list(args: argparse.Namespace) -> int:
    chosen = sites.detect()
    for name, path in sites.available().items():
        spec = sites.read_spec(path)
        print(f"{'*' if name == chosen.name else ' '} {name:<12} {spec.scheduler:<6} {spec.description}  ({path})")
    print(f"\n* auto picks {chosen.name!r}: {chosen.reason}")
    return 0


def _sites_show(args: argparse.Namespace) -> int:
    """The resolved settings as YAML, each line commented with where its value came from,
    then what the ranks get: the environment and the machine's launch flags."""
    import yaml

    site = _load_site(args)
    origins = site.provenance()
    print(f"# {site.path}")

    def show(data: dict, prefix: str = "", indent: str = "") -> None:
        for key, value in data.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and value:
                print(f"{indent}{key}:")
                show(value, f"{path}.", indent + "  ")
            else:
                text = yaml.safe_dump({key: value}, default_flow_style=True, width=10**6).strip()[1:-1]
                print(f"{indent}{text}  # {origins.get(path, 'default')}")

    show(redact(json.loads(json.dumps(site.settings()))))
    spec, machine = site.spec, get_machine(site.spec.machine)
    if timing := block_seconds(spec):
        print(f"# blocks end after {timing[0]:g} s: stages checkpoint {timing[1]:g} s before (grace period) and "
              f"continue in the next block; a block takes no new stage in its last {timing[0] - drain_period(spec):g} s")
    else:
        print("# blocks have no walltime: they last as long as the workflow")
    exported = [f"{key}={value}  ({origins[f'environment.{key}']})"
                 for key, value in redact(dict(spec.environment)).items()]
    exported += [f"{key}={value}  (machine {machine.name})" for key, value in (machine.rank_env() if machine else {}).items()]
    print("# exported to every rank (stages: through the workers; parsl-torch launch: unless already set):"
          if exported else "# exported to every rank: nothing beyond the environment the workflow runs in")
    for line in exported:
        print(f"#   {line}")
    if machine and spec.launch.extra_args is None:
        ppn = site.ranks_per_node
        print(f"# launch flags for {ppn} ranks per node (machine {machine.name}): "
              f"{shlex.join(machine.binding_args(ppn))}")
    return 0


def _sites_render(args: argparse.Namespace) -> int:
    print(_load_site(args).render(args.executor), end="")
    return 0


def split_run_flags(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """``run``'s own flags (``--site S``, ``--run-dir D``, ``--fresh``, anywhere before a ``--``) and
    the script's arguments (the rest; after ``--``, everything)."""
    flags: dict[str, Any] = {}
    rest: list[str] = []
    items = iter(argv)
    for item in items:
        if item == "--":
            rest.extend(items)
            break
        name, eq, value = item.partition("=")
        if name == "--fresh" and not eq:
            flags["fresh"] = True
        elif name in ("--site", "--run-dir"):
            value = value if eq else next(items, None)
            if not value or value.startswith("--"):
                raise ConfigError(f"parsl-torch run: {name} needs a value")
            flags[name[2:].replace("-", "_")] = value
        else:
            rest.append(item)
    return flags, rest


def _run(args: argparse.Namespace) -> int:
    """Run a workflow script as __main__ with the rest of the arguments."""
    if args.script is None:
        raise ConfigError("run: give the workflow script, e.g. parsl-torch run workflows/train_eval.py "
                          "(parsl-torch run SCRIPT --help: the script's own options)")
    script = Path(args.script)
    if not script.is_file():
        raise ConfigError(f"workflow script {script} does not exist")
    given = {k: v for k, v in (("site", args.site), ("run_dir", args.run_dir), ("fresh", args.fresh)) if v is not None}
    for key in ("site", "run_dir"):
        if given.get(key) == "":
            raise ConfigError(f"parsl-torch run: --{key.replace('_', '-')} needs a value, got an empty string")
    flags, script_args = split_run_flags(args.script_args)
    flags = {**given, **flags}
    # Parsl starts its workers by name: this environment's bin must come first
    os.environ["PATH"] = path_with_python_bin()
    sys.argv = [str(script), *script_args]
    sys.path.insert(0, str(script.resolve().parent))  # as `python SCRIPT`: its own folder's modules import
    try:
        with run_flags(RunFlags(**flags, progress=True)):  # every pt.workflow in the script takes them
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except StageError as exc:  # a stage failed at run time: say which and how, without a traceback
        print(f"parsl-torch: {exc}", file=sys.stderr)
        return 1
    return 0


def _status(args: argparse.Namespace) -> int:
    """A run's stages from its files: state, progress, error line, directory."""
    try:
        data, rows = run_status.read(args.run_dir)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    if args.sort:
        return _compare(run_status.ranked(rows, args.sort, args.lowest_first), args.sort, args.json)
    if args.lowest_first is not None:
        raise ConfigError("--lowest / --highest order the stages of --sort METRIC: give --sort too")
    sweeps = sweepview.records(Path(args.run_dir))
    if args.json:
        print(json.dumps({**data, "stages": [dataclasses.asdict(r) for r in rows], "sweeps": sweeps}, indent=2))
    elif sys.stdout.isatty():
        from rich.console import Console

        Console().print(run_status.table(data, rows))
    else:
        print(f"{args.run_dir}: site {data.get('site')}, started {data.get('started')}, {run_status.ending(data)}")
        print(run_status.plain(data, rows))
    for name, record in sweeps.items() if not args.json else ():
        print(f"\n{sweepview.table(Path(args.run_dir), name, record)}")
    return 1 if any(r.state == "failed" for r in rows) else 0


def _compare(rows: list, metric: str, as_json: bool) -> int:
    """``status --sort METRIC``: a line per finished stage, best first, its metric then the rest of its result."""
    if as_json:
        print(json.dumps([{"stage": r.name, **r.result} for r in rows], indent=2))
        return 0
    width = max(len(r.name) for r in rows)
    for place, r in enumerate(rows, 1):
        others = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in r.result.items() if k != metric)
        print(f"{place:>3}. {r.name:<{width}}  {metric}={r.result[metric]:.6g}  {others}".rstrip())
    return 0


def _endpoint_config(args: argparse.Namespace) -> int:
    print(render_endpoint_config(_load_site(args).spec, args.python_env, args.io), end="")
    return 0


class _Version(argparse.Action):
    """--version: asks the installed distribution only when used (importlib.metadata costs ~20 ms)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        import importlib.metadata

        print(f"parsl-torch {importlib.metadata.version('parsl-torch')}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parsl-torch", description="Distributed PyTorch as Parsl workflows.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="show this rank's topology, device and backend")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=_info)
    _add_launch(sub)
    _add_run(sub)
    doctor = sub.add_parser("doctor", help="check this environment; exit 1 on errors")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument("--no-smoke", action="store_true", help="skip the live 2-rank all_reduce")
    doctor.set_defaults(func=_doctor)
    _add_sites(sub)
    remote_cmds.add_commands(sub)
    file_cmds.add_commands(sub)
    return parser


def _add_launch(sub: Any) -> None:
    launch = sub.add_parser(
        "launch", help="run a command on every rank with this machine's launcher",
        usage="parsl-torch launch [-n N] [--ppn P] [--nodes K] [--timeout S] [--deadline HH:MM:SS] [--dry-run] "
              "[-m MODULE] -- COMMAND [ARGS...]")
    launch.add_argument("-n", type=int, help="total ranks (default: nodes x ranks per node)")
    launch.add_argument("--ppn", type=int, help="ranks per node (default: the job's --ntasks-per-node or "
                                                 "mpiprocs, else accelerators per node, else 1)")
    launch.add_argument("--nodes", type=int, help="nodes to use (default: all of the job's)")
    launch.add_argument("--launcher", choices=all_launchers(),
                        help="the program that starts the ranks; without a scheduler: mpiexec (default when "
                             "found) or torchrun")
    launch.add_argument("--timeout", type=float, help="seconds before every rank is stopped (exit 124)")
    launch.add_argument("--deadline", metavar="HH:MM:SS",
                        help="from then on pt.should_checkpoint() is true on every rank, and ranks that catch "
                             "SIGUSR1 get it (e.g. 00:55:00 in a 1-hour job); exit code 99 is theirs to use")
    launch.add_argument("--dry-run", action="store_true", help="print the command, start nothing")
    launch.add_argument("-m", dest="module", help="run python -m MODULE; what follows -- are its arguments")
    launch.set_defaults(func=_launch, command=())


def _add_run(sub: Any) -> None:
    """``run`` and ``status``: a workflow script and its run directory."""
    run = sub.add_parser("run", help="run a workflow script (e.g. workflows/train_eval.py)",
                         usage="parsl-torch run SCRIPT [--site S] [--run-dir D] [--fresh] [SCRIPT ARGS...] "
                               "[-- ARGS FOR THE SCRIPT ONLY]",
                         description="--site, --run-dir and --fresh are run's own, wherever they stand before a "
                                     "`--`: every pt.workflow in the script takes them over what the script "
                                     "passes. Other arguments, and all after `--`, are the script's.",
                         epilog="parsl-torch run SCRIPT --help shows the script's own options.")
    run.add_argument("script", nargs="?", help="the workflow script (a Python file)")
    run.add_argument("--site", help="the site every pt.workflow of the script runs on (default: the script's)")
    run.add_argument("--run-dir", metavar="D", help="the run directory (default: the script's)")
    run.add_argument("--fresh", action="store_true", default=None, help="run every stage again")
    run.add_argument("script_args", nargs=argparse.REMAINDER, help="passed to the script")
    run.set_defaults(func=_run)
    status = sub.add_parser("status", help="the stages of a run (running or finished) and their progress",
                            usage="parsl-torch status RUN_DIR [--json] [--sort METRIC [--lowest | --highest]]")
    status.add_argument("run_dir")
    status.add_argument("--json", action="store_true", help="machine-readable")
    status.add_argument("--sort", metavar="METRIC", help="compare trials: the finished stages whose result has "
                        "METRIC, best first (losses, errors and times lowest first, others highest first)")
    order = status.add_mutually_exclusive_group()
    order.add_argument("--lowest", dest="lowest_first", action="store_true", default=None, help="lowest first")
    order.add_argument("--highest", dest="lowest_first", action="store_false", help="highest first")
    status.set_defaults(func=_status)


def _add_sites(sub: Any) -> None:
    sites_cmd = sub.add_parser("sites", help="machines this package knows (alone: the list)")
    sites_cmd.set_defaults(func=_sites_list)
    site_cmds = sites_cmd.add_subparsers(dest="action")
    site_cmds.add_parser("list", help="known sites and which one auto picks here").set_defaults(func=_sites_list)
    for action, func, what in (("show", _sites_show, "the resolved settings of a site"),
                               ("render", _sites_render, "the batch script Parsl would submit (not submitted)"),
                               ("endpoint-config", _endpoint_config,
                                "a Globus Compute endpoint config.yaml for a batch site")):
        cmd = site_cmds.add_parser(action, help=what)
        cmd.add_argument("site", nargs="?", default="auto", help="site name (default: auto)")
        cmd.add_argument("--account")
        cmd.add_argument("--queue", help="PBS queue or Slurm partition")
        cmd.add_argument("--walltime", help="HH:MM:SS")
        cmd.add_argument("--nodes", type=int, help="nodes per block")
        if action == "render":
            cmd.add_argument("--executor", choices=("mpi", "htex"), default="mpi")
        if action == "endpoint-config":
            cmd.add_argument("--python-env", default="$HOME/parsl-torch-env",
                             help="the environment on the machine that holds parsl-torch")
            cmd.add_argument("--io", action="store_true",
                             help="the endpoint beside it for a sweep's looks at its trials' files "
                                  "(globus.io_endpoint_id)")
        cmd.set_defaults(func=func)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # launch: everything after the first "--" is the command, untouched (run hands "--" to its script)
    launching = next((a for a in argv if not a.startswith("-")), None) == "launch"
    command = argv[argv.index("--") + 1:] if launching and "--" in argv else []
    argv = argv[:argv.index("--")] if launching and "--" in argv else argv
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and launching and not command and not unknown[0].startswith("-"):
        given = shlex.join(argv[argv.index("launch") + 1:len(argv) - len(unknown)])
        parser.error(f"launch: put `--` before the command: parsl-torch launch {given + ' ' if given else ''}"
                     f"-- {shlex.join(unknown)}")
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if command:
        args.command = command
    try:
        return args.func(args)
    except ParslTorchError as exc:
        print(f"parsl-torch: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the workflow has recorded it and stopped what it started
        print("parsl-torch: interrupted (SIGINT)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
