"""The ``parsl-torch`` command.

User mistakes (any ParslTorchError) print one line and exit 2, no traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from .errors import ParslTorchError


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


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="parsl-torch", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"parsl-torch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="show this rank's topology, device and backend")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=_info)
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
