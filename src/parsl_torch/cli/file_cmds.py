"""``parsl-torch history show|plot`` and ``parsl-torch checkpoint export``: the files stages leave."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import ConfigError


def _history_show(args: argparse.Namespace) -> int:
    """A table of last/min/max/mean (of the finite values) per metric and how many of its recorded steps
    are not finite (a loss gone NaN: last shows nan), with the file's status and steps."""
    from ..history.h5file import read_history, summarize

    data = read_history(args.file)
    a = data.attrs
    print(f"{data.path}: stage {a.get('stage')!r}, status {a.get('status')}, {len(data.steps)} steps, "
          f"{a.get('world_size')} rank(s) on {a.get('num_nodes')} node(s), {a.get('start_time')} .. "
          f"{a.get('end_time') or '-'}")
    width = max([len(m) for m in data.metrics] + [6])
    print(f"{'metric':<{width}} {'last':>12} {'min':>12} {'max':>12} {'mean':>12} {'not finite':>10}  of")
    for metric, row in summarize(data).items():
        print(f"{metric:<{width}} " + " ".join(f"{row[k]:>12.6g}" for k in ("last", "min", "max", "mean"))
              + f" {row['not finite']:>10}  {row['of']}")
    return 0


def _checkpoint_export(args: argparse.Namespace) -> int:
    from ..stages import checkpoint

    try:
        out = checkpoint.export(args.checkpoint, args.out)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"checkpoint export: {exc}") from None
    print(out)
    return 0


def _history_plot(args: argparse.Namespace) -> int:
    from ..history.plots import plot_history

    try:
        written = plot_history(args.file, args.out)
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install 'parsl-torch[history]'") from None
    for path in written:
        print(path)
    return 0


def add_commands(sub: Any) -> None:
    """``history`` and ``checkpoint``: the files stages leave."""
    history = sub.add_parser("history", help="inspect history files").add_subparsers(dest="action", required=True)
    show = history.add_parser("show", help="summary table of a history file")
    show.add_argument("file")
    show.set_defaults(func=_history_show)
    plot = history.add_parser("plot", help="write a PNG per metric")
    plot.add_argument("file")
    plot.add_argument("--out", help="directory for the PNGs (default: <file stem>-plots beside it)")
    plot.set_defaults(func=_history_plot)

    checkpoint = sub.add_parser("checkpoint", help="built-in stages' checkpoints").add_subparsers(
        dest="action", required=True)
    export = checkpoint.add_parser("export", help="a sharded (fsdp) checkpoint as one file every strategy reads",
                                   usage="parsl-torch checkpoint export CHECKPOINT OUT.pt")
    export.add_argument("checkpoint", help="the train stage's checkpoint (a link to its sharded directory)")
    export.add_argument("out", help="the single file to write")
    export.set_defaults(func=_checkpoint_export)
