"""The ``parsl-torch`` command.

User mistakes (any ParslTorchError) print one line and exit 2, no traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from .errors import ConfigError, ParslTorchError


def _info(args: argparse.Namespace) -> int:
    """What this process would be: topology, device and backend (no communication)."""
    from .device import get_backend, get_torch_device_type
    from .topology import env_topology

    device = get_torch_device_type()
    info = {**dataclasses.asdict(env_topology()), "device": device, "backend": get_backend(device)}
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for key, value in info.items():
            print(f"{key:>17}: {value}")
    return 0


def _history_show(args: argparse.Namespace) -> int:
    """A table of last/min/max/mean per metric, with the file's status and steps."""
    import numpy as np

    from .history_io import read_history

    data = read_history(args.file)
    a = data.attrs
    print(f"{data.path}: stage {a.get('stage')!r}, status {a.get('status')}, {len(data.steps)} steps, "
          f"{a.get('world_size')} rank(s) on {a.get('num_nodes')} node(s), {a.get('start_time')} .. "
          f"{a.get('end_time') or '-'}")
    width = max([len(m) for m in data.metrics] + [6])
    print(f"{'metric':<{width}} {'last':>12} {'min':>12} {'max':>12} {'mean':>12}  of")
    for metric, values in data.metrics.items():
        # with several ranks, summarise the mean over ranks (rank 0 may lack a metric)
        stats = data.stats.get(metric)
        values, source = (stats["mean"], "mean over ranks") if stats else (values, "rank 0")
        finite = values[np.isfinite(values)]
        last = values[~np.isnan(values)][-1] if (~np.isnan(values)).any() else np.nan
        row = (last, *(f(finite) if finite.size else np.nan for f in (np.min, np.max, np.mean)))
        print(f"{metric:<{width}} " + " ".join(f"{v:>12.6g}" for v in row) + f"  {source}")
    return 0


def _history_plot(args: argparse.Namespace) -> int:
    from .plots import plot_history

    try:
        written = plot_history(args.file, args.out)
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install 'parsl-torch[history]'") from None
    for path in written:
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="parsl-torch", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"parsl-torch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="show this rank's topology, device and backend")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=_info)

    history = sub.add_parser("history", help="inspect history files").add_subparsers(dest="action", required=True)
    show = history.add_parser("show", help="summary table of a history file")
    show.add_argument("file")
    show.set_defaults(func=_history_show)
    plot = history.add_parser("plot", help="write a PNG per metric")
    plot.add_argument("file")
    plot.add_argument("--out", help="directory for the PNGs (default: <file stem>-plots beside it)")
    plot.set_defaults(func=_history_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ParslTorchError as exc:
        print(f"parsl-torch: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
