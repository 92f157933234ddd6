"""`hvdkit bench`: hvdkit next to its peers, measured in one invocation on the same hosts.

    hvdkit bench allreduce -np 2                         # sweep 4 KiB..256 MiB, 6 implementations
    hvdkit bench allreduce -np 8 -H a:4,b:4 -p 12345 --sizes 1M,16M,64M
    hvdkit bench train -np 1,2 --models mnist            # samples/s and time split, 3 implementations

Parsing and printing only: the launches are planned and run by
:mod:`hvdkit.bench.runner`, and reported by :mod:`hvdkit.bench.report`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from hvdkit.bench import report
from hvdkit.bench.catalog import ALLREDUCE_IMPLS, MODELS, TRAIN_IMPLS
from hvdkit.bench.runner import BenchTarget, TrainBench, plan_allreduce, plan_train, run_launches
from hvdkit.bench.train_report import plot_train, train_rows, train_table
from hvdkit.cli.hosts import add_host_arguments, add_ssh_arguments, spec_from_args
from hvdkit.core.errors import UserError
from hvdkit.core.hosts import parse_hosts_string
from hvdkit.core.launch import BuildFlags
from hvdkit.core.units import parse_byte_range


def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _np_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"-np {text!r} is not a list of process counts: write e.g. -np 2 or -np 1,2,4") from None
    if not values or min(values) < 1:
        raise UserError(f"-np {text!r}: process counts must be 1 or more")
    return values


def _target(args: argparse.Namespace, np: int) -> BenchTarget:
    given = args.hosts or args.hostfile or args.slurm
    hosts = spec_from_args(args) if given else parse_hosts_string(f"localhost:{np}")
    return BenchTarget(np=np, hosts=hosts, ssh_port=args.ssh_port, ssh_identity_file=args.ssh_identity_file,
                       network_interface=args.network_interface)


def _common(parser: argparse.ArgumentParser) -> None:
    add_host_arguments(parser)
    add_ssh_arguments(parser)
    parser.add_argument("--out", default="bench-results", help="directory for the CSV, JSON and PNG (default "
                                                               "%(default)s)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed per launch (default %(default)g)")
    parser.add_argument("--dry-run", action="store_true", help="print the launches, run nothing")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("bench", help="benchmark hvdkit against raw Horovod, torch.distributed and MPI",
                            description="Benchmarks run every implementation in turn on the same hosts and "
                                        "process count, and report them side by side.")
    kinds = parser.add_subparsers(dest="bench", metavar="KIND", required=True)

    ar = kinds.add_parser("allreduce", help="allreduce bandwidth sweep and ResNet-50 tensor fusion")
    ar.add_argument("-np", "--num-proc", dest="np", type=int, default=2, help="processes (default %(default)s)")
    ar.add_argument("--sizes", default="4K:256M", help="LOW:HIGH (powers of 4) or a list, e.g. 1M,16M (default "
                                                       "%(default)s)")
    ar.add_argument("--repeats", type=int, default=5, help="timed repeats per size in each launch (median taken)")
    ar.add_argument("--rounds", type=int, default=3,
                    help="launches of every implementation, interleaved; the median over rounds is reported")
    ar.add_argument("--impls", default=",".join(ALLREDUCE_IMPLS), help="comma-separated (default: all)")
    ar.add_argument("--no-resnet", action="store_true", help="skip the ResNet-50 many-tensors case")
    _common(ar)
    ar.set_defaults(func=allreduce_command)

    tr = kinds.add_parser("train", help="training throughput and time split: hvdkit vs Horovod by hand vs torchrun+DDP")
    tr.add_argument("-np", "--num-proc", dest="np_list", default="2",
                    help="process counts, e.g. 1,2 (scaling efficiency is reported against the first)")
    tr.add_argument("--models", default=",".join(MODELS),
                    help="mnist (the example's convnet), resnet50 (synthetic images)")
    tr.add_argument("--impls", default=",".join(TRAIN_IMPLS), help="comma-separated (default: all)")
    tr.add_argument("--batch-size", type=int, default=None, help="per process (default: mnist 32, resnet50 16)")
    tr.add_argument("--repeats", type=int, default=3, help="runs of each launch, interleaved; medians reported")
    tr.add_argument("--steps", type=int, default=30, help="timed steps per run (default %(default)s)")
    tr.add_argument("--warmup", type=int, default=6, help="untimed steps first (default %(default)s)")
    tr.add_argument("--image-size", type=int, default=64, help="resnet50 input side (default %(default)s)")
    _common(tr)
    tr.set_defaults(func=train_command)
    return parser


def allreduce_command(args: argparse.Namespace) -> int:
    if args.np < 1:
        raise UserError(f"-np {args.np} is not a process count: use 1 or more")
    if args.repeats < 1 or args.rounds < 1:
        raise UserError(f"--repeats {args.repeats} --rounds {args.rounds}: use 1 or more for both")
    target = _target(args, args.np)
    launches, skipped = plan_allreduce(target, BuildFlags.detect(), list(_names(args.impls)),
                                       parse_byte_range(args.sizes), args.repeats, resnet=not args.no_resnet)
    if args.dry_run:
        return _print_launches(launches)
    started = time.time()
    # Rounds of every implementation in turn: on a shared machine the noise
    # comes in bursts of seconds, which would otherwise hit one implementation.
    payloads, failures = run_launches(launches * args.rounds, args.timeout, desc="allreduce")
    rows = report.allreduce_rows(payloads)
    machine = report.machine_line(payloads[0]) if payloads else "?"
    title = f"allreduce, {args.np} processes on {len(target.hosts.hosts)} host(s); {machine}"
    data = report.results_data("allreduce", payloads, started, skipped, failures, rows, np=args.np,
                               hosts=target.hosts.names, rounds=args.rounds,
                               env={p["impl"]: p.get("env", {}) for p in payloads})
    return _finish(args, data, title, report.allreduce_table(rows), report.plot_allreduce)


def train_command(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise UserError(f"--repeats {args.repeats}: use 1 or more")
    np_list = _np_list(args.np_list)
    bench = TrainBench(models=_names(args.models), impls=_names(args.impls), batch_size=args.batch_size,
                       steps=args.steps, warmup=args.warmup, image_size=args.image_size)
    launches, skipped = plan_train([_target(args, np) for np in np_list], BuildFlags.detect(), bench)
    if args.dry_run:
        return _print_launches(launches)
    started = time.time()
    # Rounds of every launch in turn, so slow drift on a shared machine hits all implementations alike.
    payloads, failures = run_launches(launches * args.repeats, args.timeout, desc="train")
    rows = train_rows(payloads)
    machine = report.machine_line(payloads[0]) if payloads else "?"
    data = report.results_data("train", payloads, started, skipped, failures, rows, np=np_list)
    return _finish(args, data, f"training step; {machine}", train_table(rows), plot_train)


def _print_launches(launches) -> int:
    for launch in launches:
        print(launch.shell())
    return 0


def _finish(args: argparse.Namespace, data: dict, title: str, table: str, plot) -> int:
    """Write the files, print the table (or --json) and the skips; failures on stderr, exit 1."""
    report.write_results(args.out, data, title, table, plot)
    if args.json:
        print(json.dumps(data))
    else:
        print(title)
        print(table)
        for impl, why in data["skipped"].items():
            print(f"skipped {impl}: {why}")
        print(f"wrote {args.out}/{data['kind']}.csv, .json, .txt, .png")
    for failure in data["failures"]:
        print(f"hvdkit bench: error: {failure}", file=sys.stderr)
    return 1 if data["failures"] else 0
