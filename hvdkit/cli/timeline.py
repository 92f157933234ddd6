"""`hvdkit timeline`: which rank the others wait for, and where the collective time goes, from Horovod's timeline.

    hvdkit launch -np 2 -H localhost:2 --timeline timeline.json -- python train.py   # record it
    hvdkit timeline timeline.json                   # a table per rank and tensor, and timeline.png
    hvdkit timeline timeline.json --json --plot none

The reading is hvdkit.ops.timeline's; a file of a job that was killed (left
unterminated) is read up to its last whole event.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

from hvdkit.argtypes import positive_int
from hvdkit.ops.plots import plot_timeline
from hvdkit.ops.timeline import analyze, format_report, read_timeline


@dataclass(frozen=True)
class TimelineConfig:
    path: str
    plot: str | None                  # None: no PNG
    top: int = 10
    json: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TimelineConfig:
        if args.plot is None:
            plot = os.path.splitext(args.file)[0] + ".png"
        else:
            plot = None if args.plot == "none" else args.plot
        return cls(path=args.file, plot=plot, top=args.top, json=args.json)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("timeline", help="per rank: how late it reaches each allreduce; the heaviest tensors",
                       description="Read Horovod's timeline (hvdkit launch --timeline FILE, or HOROVOD_TIMELINE) "
                                   "and report how late each rank reports tensors ready, time waiting against "
                                   "reducing, and the tensors that take longest.")
    p.add_argument("file", help="the timeline rank 0 wrote (Chrome trace JSON; an unterminated one is fine)")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="write the picture here (default: FILE with .png; 'none' for no picture)")
    p.add_argument("--top", type=positive_int, default=10, help="how many of the heaviest tensors to list")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(config=TimelineConfig.from_args, run=run)
    return p


def run(config: TimelineConfig) -> int:
    report = analyze(read_timeline(config.path), top=config.top)
    if config.plot:
        plot_timeline(config.plot, report, title=os.path.basename(config.path))
    if config.json:
        print(json.dumps(report.as_dict()))
        return 0
    print(format_report(report))
    if config.plot:
        print(f"wrote {config.plot}")
    return 0
