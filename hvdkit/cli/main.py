"""`hvdkit` entry point: builds the parser from the subcommand modules.

Every module has the same two parts: ``add_parser(subparsers)`` registers its
arguments and sets ``config`` (the function that turns them into one frozen,
validated config) and ``run`` (which takes that config and returns the exit code).
"""

from __future__ import annotations

import argparse
import sys

from hvdkit import __version__
from hvdkit.cli import bench as bench_cmd
from hvdkit.cli import costmodel as plan_cmd
from hvdkit.cli import doctor as doctor_cmd
from hvdkit.cli import env as env_cmd
from hvdkit.cli import hosts as hosts_cmd
from hvdkit.cli import launch as launch_cmd
from hvdkit.cli import timeline as timeline_cmd
from hvdkit.common.errors import UserError

SUBCOMMANDS = (env_cmd, hosts_cmd, doctor_cmd, launch_cmd, timeline_cmd, bench_cmd, plan_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hvdkit", description="Horovod data-parallel training for PyTorch and Keras."
    )
    parser.add_argument("--version", action="version", version=f"hvdkit {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
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
