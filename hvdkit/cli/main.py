"""`hvdkit` entry point: builds the parser from the subcommand modules.

Every module has the same two parts: ``add_parser(subparsers)`` registers its
arguments and sets ``config`` (the function that turns them into one frozen,
validated config) and ``run`` (which takes that config and returns the exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from hvdkit import __version__
from hvdkit.common.errors import UserError

# Each subcommand's module, imported only when its command runs (or for `hvdkit --help`): a discovery script runs
# `hvdkit hosts` every second of an elastic job, and `bench` alone imports what took 0.23 s of a 0.42 s run.
SUBCOMMANDS = {
    "env": "hvdkit.cli.env",
    "hosts": "hvdkit.cli.hosts",
    "doctor": "hvdkit.cli.doctor",
    "launch": "hvdkit.cli.launch",
    "timeline": "hvdkit.cli.timeline",
    "bench": "hvdkit.cli.bench",
    "plan": "hvdkit.cli.costmodel",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``only`` the one subcommand a command line names (the others not imported)."""
    parser = argparse.ArgumentParser(
        prog="hvdkit", description="Horovod data-parallel training for PyTorch and Keras."
    )
    parser.add_argument("--version", action="version", version=f"hvdkit {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    for name, module in SUBCOMMANDS.items():
        if only in (None, name):
            importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv and argv[0] in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return args.run(args.config(args))
    except UserError as exc:
        print(f"hvdkit {args.subcommand}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
