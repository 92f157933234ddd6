"""`hvdkit env`: versions and Horovod build flags, for bug reports.

    hvdkit env           # readable report
    hvdkit env --json    # the same, as JSON for scripts
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from hvdkit.core.envreport import collect, render_text


@dataclass(frozen=True)
class EnvConfig:
    json: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EnvConfig:
        return cls(json=args.json)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "env",
        help="print Python, framework, Horovod, MPI and NCCL versions and Horovod's build flags",
        description="Print the environment for bug reports: versions and how Horovod was built.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(config=EnvConfig.from_args, run=run)
    return parser


def run(config: EnvConfig) -> int:
    report = collect()
    print(json.dumps(report.to_dict(), indent=2) if config.json else render_text(report))
    # A report is still useful without Horovod, but scripts should notice.
    return 0 if report.horovod is not None else 1
