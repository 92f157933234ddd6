"""`hvdkit env`: versions, Horovod build flags and the HOROVOD_* settings, for bug reports.

    hvdkit env           # readable report
    hvdkit env --json    # the same, as JSON for scripts

It is a report: it always prints all of it. Its exit status says whether this
environment can run a job: 1 without a usable Horovod, 2 (as ``hvdkit
launch``, with launch's error line on stderr) when a HOROVOD_* setting is one
Horovod would misread.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from hvdkit.ops.envreport import collect, render_text


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
    print(json.dumps(report.to_dict(), indent=2) if config.json else render_text(report), flush=True)
    for message in report.setting_errors.values():
        print(f"hvdkit env: error: {message}", file=sys.stderr)
    if report.setting_errors:
        return 2          # what hvdkit launch exits with in this environment
    # A report is still useful without Horovod, but scripts should notice.
    return 0 if report.horovod is not None else 1
