"""`hvdkit bench`: hvdkit next to its peers, measured in one invocation on the same hosts.

    hvdkit bench allreduce -np 2                         # sweep 4 KiB..256 MiB, 6 implementations
    hvdkit bench allreduce -np 8 -H a:4,b:4 -p 12345 --sizes 1M,16M,64M
    hvdkit bench train -np 1,2 --models mnist            # samples/s and time split, 3 implementations

Parsing and printing only: the launches are planned and run by
:mod:`hvdkit.bench.runner`, and reported by :mod:`hvdkit.bench.report`.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass

from hvdkit.bench import report
from hvdkit.bench.catalog import MODELS, every_implementation, implementations
from hvdkit.bench.runner import AllreduceBench, TrainBench, plan_allreduce, plan_train, run_launches
from hvdkit.bench.train_report import PHASES, train_rows, train_table
from hvdkit.cli.args import (
    add_host_arguments,
    add_np_argument,
    add_ssh_arguments,
    hosts_given,
    resolve_hosts,
    target_from_args,
)
from hvdkit.common.errors import UserError
from hvdkit.common.units import parse_byte_range
from hvdkit.ops import slurm
from hvdkit.ops.launch import BuildFlags, LaunchTarget
from hvdkit.ops.plots import plot_allreduce, plot_train


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


def _target(args: argparse.Namespace, np: int | None) -> LaunchTarget:
    """``np`` processes where launch would run them (:func:`hvdkit.cli.args.resolve_hosts`)."""
    hosts, np, _ = resolve_hosts(args, np)
    return target_from_args(args, np, hosts)


@dataclass(frozen=True)
class BenchOutput:
    """Where the results go, and how long each launch may take; shared by both benchmarks."""

    out: str = "bench-results"
    timeout: float = 900
    dry_run: bool = False
    json: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchOutput:
        return cls(out=args.out, timeout=args.timeout, dry_run=args.dry_run, json=args.json)


@dataclass(frozen=True)
class AllreduceConfig:
    target: LaunchTarget
    bench: AllreduceBench
    rounds: int
    output: BenchOutput

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AllreduceConfig:
        if args.np is not None and args.np < 1:
            raise UserError(f"-np {args.np} is not a process count: use 1 or more")
        if args.repeats < 1 or args.rounds < 1:
            raise UserError(f"--repeats {args.repeats} --rounds {args.rounds}: use 1 or more for both")
        np = args.np if args.np is not None or hosts_given(args) or slurm.in_allocation(os.environ) else 2
        target = _target(args, np)
        _check_server_np(implementations("allreduce", _names(args.impls)), [target.np])
        if args.iterations is not None and args.iterations < 1:
            raise UserError(f"--iterations {args.iterations}: use 1 or more (or leave it out)")
        bench = AllreduceBench(sizes=tuple(parse_byte_range(args.sizes)),
                               impls=implementations("allreduce", _names(args.impls)), repeats=args.repeats,
                               resnet=not args.no_resnet, iterations=args.iterations)
        return cls(target=target, bench=bench, rounds=args.rounds, output=BenchOutput.from_args(args))


@dataclass(frozen=True)
class TrainConfig:
    targets: tuple[LaunchTarget, ...]    # one per process count, the first the base of scaling efficiency
    bench: TrainBench
    repeats: int
    output: BenchOutput

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainConfig:
        if args.repeats < 1:
            raise UserError(f"--repeats {args.repeats}: use 1 or more")
        np_list = ([_target(args, None).np] if hosts_given(args) or slurm.in_allocation(os.environ) else [2]) \
            if args.np_list is None else _np_list(args.np_list)
        impls = implementations("train", _names(args.impls))
        _check_server_np(impls, np_list)
        bench = TrainBench(models=_names(args.models), impls=impls, batch_size=args.batch_size, steps=args.steps,
                           warmup=args.warmup, image_size=args.image_size, threads=_threads(os.environ))
        return cls(targets=tuple(_target(args, np) for np in np_list), bench=bench, repeats=args.repeats,
                   output=BenchOutput.from_args(args))


def _check_server_np(impls, np_list) -> None:
    """A parameter server needs itself and a worker: -np counts both."""
    if any(i.name == "ps" for i in impls) and min(np_list) < 2:
        raise UserError(f"-np {min(np_list)} with --impls ps: the first process is the server, so use -np 2 or more "
                        "(e.g. -np 3 -H server:1,worker1:1,worker2:1)")


def _threads(environ) -> int | None:
    """OMP_NUM_THREADS when the environment sets it (its word is final), else None: the runner's default."""
    value = (environ.get("OMP_NUM_THREADS") or "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"OMP_NUM_THREADS={value!r} is not a thread count: set e.g. OMP_NUM_THREADS=1, or unset it")
    return int(value)


def _common(parser: argparse.ArgumentParser) -> None:
    add_host_arguments(parser)
    add_ssh_arguments(parser)
    parser.add_argument("--out", default="bench-results", help="directory for the CSV, JSON and PNG (default "
                                                               "%(default)s)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed per launch (default %(default)g)")
    parser.add_argument("--dry-run", action="store_true", help="print the launches, run nothing")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")


def _implementations_epilog(bench: str) -> str:
    """The --impls names and what each runs, from the catalog, for the end of --help."""
    return "implementations:\n" + "\n".join(f"  {i.name:<13} {i.description}" for i in every_implementation(bench))


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("bench", help="benchmark hvdkit against raw Horovod, torch.distributed and MPI",
                            description="Benchmarks run every implementation in turn on the same hosts and "
                                        "process count, and report them side by side.")
    kinds = parser.add_subparsers(dest="bench", metavar="KIND", required=True)

    ar = kinds.add_parser("allreduce", help="allreduce bandwidth sweep and ResNet-50 tensor fusion",
                          epilog=_implementations_epilog("allreduce"),
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    add_np_argument(ar, help="processes (default: every slot of the hosts given or the Slurm allocation's tasks, as "
                             "for launch; 2 on this machine when no hosts are given)")
    ar.add_argument("--sizes", default="4K:256M", help="LOW:HIGH (powers of 4) or a list, e.g. 1M,16M (default "
                                                       "%(default)s)")
    ar.add_argument("--repeats", type=int, default=5, help="timed repeats per size in each launch (median taken)")
    ar.add_argument("--rounds", type=int, default=3,
                    help="launches of every implementation, interleaved; the median over rounds is reported")
    ar.add_argument("--impls", default=",".join(i.name for i in implementations("allreduce")),
                    help="comma-separated (default: all listed below but ps)")
    ar.add_argument("--no-resnet", action="store_true", help="skip the ResNet-50 many-tensors case")
    ar.add_argument("--iterations", type=int, default=None,
                    help="allreduces per timed repeat (default: up to 100 for small messages, 3 for large); "
                         "fewer keeps slow links short")
    _common(ar)
    ar.set_defaults(config=AllreduceConfig.from_args, run=run)

    tr = kinds.add_parser("train", help="training throughput and time split: hvdkit vs Horovod by hand vs torchrun+DDP",
                          epilog=_implementations_epilog("train"), formatter_class=argparse.RawDescriptionHelpFormatter)
    tr.add_argument("-np", "--num-proc", dest="np_list",
                    help="process counts, e.g. 1,2 (scaling efficiency is reported against the first; default: as "
                         "for launch, every slot of the hosts given or the allocation's tasks, else 2 here)")
    tr.add_argument("--models", default=",".join(MODELS),
                    help="mnist (the example's convnet), resnet50 (synthetic images)")
    tr.add_argument("--impls", default=",".join(i.name for i in implementations("train")),
                    help="comma-separated (default: all listed below but ps)")
    tr.add_argument("--batch-size", type=int, default=None, help="per process (default: mnist 32, resnet50 16)")
    tr.add_argument("--repeats", type=int, default=3, help="runs of each launch, interleaved; medians reported")
    tr.add_argument("--steps", type=int, default=30, help="timed steps per run (default %(default)s)")
    tr.add_argument("--warmup", type=int, default=6, help="untimed steps first (default %(default)s)")
    tr.add_argument("--image-size", type=int, default=64, help="resnet50 input side (default %(default)s)")
    _common(tr)
    tr.set_defaults(config=TrainConfig.from_args, run=run)
    return parser


def require_torch() -> None:
    """Every implementation's worker moves torch tensors (mpi4py's too): without torch, one line, not N tracebacks."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ValueError, ImportError):     # in sys.modules as None, or a finder that refuses it
        found = False
    if not found:
        raise UserError("hvdkit bench needs PyTorch (its workers time torch tensors and models), which this "
                        "environment lacks (the TensorFlow GPU flavour has none): run it in the torch flavour "
                        "(.venv-gpu, the default image) or the CPU venv (.venv)")


def run(config: AllreduceConfig | TrainConfig) -> int:
    """Plan every launch; print them (--dry-run), or run them in rounds and report."""
    if not config.output.dry_run:
        require_torch()
    if isinstance(config, AllreduceConfig):
        return _run_allreduce(config)
    return _run_train(config)


def _run_allreduce(config: AllreduceConfig) -> int:
    target, output = config.target, config.output
    launches, skipped = plan_allreduce(target, BuildFlags.detect(), config.bench)
    if output.dry_run:
        return _print_launches(launches)
    report.check_results_dir(output.out)      # before minutes of measuring, not after
    started = time.time()
    # Rounds of every implementation in turn: on a shared machine the noise
    # comes in bursts of seconds, which would otherwise hit one implementation.
    payloads, failures = run_launches(launches * config.rounds, output.timeout, desc="allreduce")
    rows = report.allreduce_rows(payloads)
    machine = report.machine_line(payloads[0]) if payloads else "?"
    title = f"allreduce, {target.np} processes on {len(target.hosts.hosts)} host(s); {machine}"
    data = report.results_data("allreduce", payloads, started, skipped, failures, rows, np=target.np,
                               hosts=target.hosts.names, rounds=config.rounds,
                               env={p["impl"]: p.get("env", {}) for p in payloads})
    return _finish(output, data, title, report.allreduce_table(rows), plot_allreduce)


def _run_train(config: TrainConfig) -> int:
    output = config.output
    launches, skipped = plan_train(list(config.targets), BuildFlags.detect(), config.bench)
    if output.dry_run:
        return _print_launches(launches)
    report.check_results_dir(output.out)
    started = time.time()
    # Rounds of every launch in turn, so slow drift on a shared machine hits all implementations alike.
    payloads, failures = run_launches(launches * config.repeats, output.timeout, desc="train")
    rows = train_rows(payloads)
    machine = report.machine_line(payloads[0]) if payloads else "?"
    data = report.results_data("train", payloads, started, skipped, failures, rows,
                               np=[t.np for t in config.targets])
    return _finish(output, data, f"training step; {machine}", train_table(rows),
                   functools.partial(plot_train, phases=PHASES))


def _print_launches(launches) -> int:
    for launch in launches:
        print(launch.shell())
    return 0


def _finish(output: BenchOutput, data: dict, title: str, table: str, plot) -> int:
    """Print the table (or --json) and the skips, then write the files; failures on stderr, exit 1.

    Printed first, so a disk that filled up meanwhile loses no measurement (the write then stops
    with one line, and the previous files stay whole)."""
    if output.json:
        print(json.dumps(data), flush=True)
    else:
        print(title)
        print(table)
        for impl, why in data["skipped"].items():
            print(f"skipped {impl}: {why}")
        sys.stdout.flush()
    report.write_results(output.out, data, title, table, plot)
    if not output.json:
        print(f"wrote {output.out}/{data['kind']}.csv, .json, .txt, .png")
    for failure in data["failures"]:
        print(f"hvdkit bench: error: {failure}", file=sys.stderr)
    return 1 if data["failures"] else 0
