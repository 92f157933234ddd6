"""`hvdkit env`: versions, Horovod build flags and the HOROVOD_* settings, for bug reports.

    hvdkit env                        # readable report
    hvdkit env --json                 # the same, as JSON for scripts
    hvdkit env --require torch,nccl   # and exit 1 unless Horovod was built with both

It is a report: it always prints all of it. Its exit status says whether this
environment can run a job: 1 without a usable Horovod (or without a feature
``--require`` names), 2 (as ``hvdkit launch``, with launch's error line on
stderr) when a HOROVOD_* setting is one Horovod would misread.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from hvdkit.ops.envreport import BUILD_FEATURES, collect, missing_features, render_text


@dataclass(frozen=True)
class EnvConfig:
    json: bool = False
    require: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EnvConfig:
        return cls(json=args.json, require=args.require)


def features(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in BUILD_FEATURES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or 'nothing'} is not a Horovod build feature: "
                                         f"name some of {','.join(BUILD_FEATURES)}")
    return names


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "env",
        help="print Python, framework, Horovod, MPI and NCCL versions and Horovod's build flags",
        description="Print the environment for bug reports: versions and how Horovod was built.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--require", type=features, default=(), metavar="FEATURES",
                        help="exit 1 unless Horovod was built with each of these (comma-separated: "
                             f"{','.join(BUILD_FEATURES)}); scripts/install.sh and Dockerfile.gpu check builds so")
    parser.set_defaults(config=EnvConfig.from_args, run=run)
    return parser


def run(config: EnvConfig) -> int:
    report = collect()
    print(json.dumps(report.to_dict(), indent=2) if config.json else render_text(report), flush=True)
    for message in report.setting_errors.values():
        print(f"hvdkit env: error: {message}", file=sys.stderr)
    if report.setting_errors:
        return 2          # what hvdkit launch exits with in this environment
    missing = missing_features(report.horovod, config.require)
    if missing:
        why = f"Horovod is not usable ({report.horovod_error})" if report.horovod is None else \
            f"Horovod was built without {', '.join(missing)}"
        print(f"hvdkit env: error: {why}: rebuild it with scripts/install.sh (--gpu for nccl and cuda)",
              file=sys.stderr)
        return 1
    # A report is still useful without Horovod, but scripts should notice.
    return 0 if report.horovod is not None else 1
