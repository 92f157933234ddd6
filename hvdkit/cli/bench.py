"""`hvdkit bench`: hvdkit next to its peers, measured in one invocation on the same hosts.

    hvdkit bench allreduce -np 2                         # sweep 4 KiB..256 MiB, 5 implementations
    hvdkit bench allreduce -np 8 -H a:4,b:4 -p 12345 --sizes 1M,16M,64M
    hvdkit bench train -np 1,2 --model mnist             # samples/s and time split, 3 implementations
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

from hvdkit.bench import report
from hvdkit.bench.runner import BenchTarget, available, plan_horovodrun, run_launches
from hvdkit.cli.doctor import add_ssh_arguments
from hvdkit.cli.hosts import add_host_arguments, spec_from_args
from hvdkit.core.envreport import probe_horovod
from hvdkit.core.errors import UserError
from hvdkit.core.hosts import parse_hosts_string
from hvdkit.core.launch import BuildFlags

ALLREDUCE_IMPLS = ("hvdkit", "horovod-mpi", "horovod-gloo", "torch", "mpi4py")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GIB": 1 << 30}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise UserError(f"size {text!r} is not understood: write e.g. 4096, 64K, 16M or 1G")
    value = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if value < 4:
        raise UserError(f"size {text!r} is under one float32: use at least 4 bytes")
    return value


def parse_sizes(text: str) -> list[int]:
    """``4K:256M`` (every power of 4 from 4 KiB to 256 MiB) or a list ``1M,16M,64M``."""
    if ":" in text:
        lo, hi = (parse_size(t) for t in text.split(":", 1))
        if lo > hi:
            raise UserError(f"size range {text!r} runs backwards: write LOW:HIGH, e.g. 4K:256M")
        sizes = [lo]
        while sizes[-1] * 4 <= hi:
            sizes.append(sizes[-1] * 4)
        return sizes
    return [parse_size(t) for t in text.split(",") if t.strip()]


def _target(args: argparse.Namespace) -> BenchTarget:
    given = args.hosts or args.hostfile or args.slurm
    hosts = spec_from_args(args) if given else parse_hosts_string(f"localhost:{args.np}")
    return BenchTarget(np=args.np, hosts=hosts, ssh_port=args.ssh_port, ssh_identity_file=args.ssh_identity_file,
                       network_interface=args.network_interface)


def _build() -> BuildFlags:
    build, error = probe_horovod()
    if build is None:
        raise UserError(f"Horovod is not usable here ({error}): run scripts/install.sh")
    return BuildFlags(mpi=build.controllers["mpi"], gloo=build.controllers["gloo"])


def _common(parser: argparse.ArgumentParser) -> None:
    add_host_arguments(parser)
    add_ssh_arguments(parser)
    parser.add_argument("--out", default="bench-results", help="directory for the CSV, JSON and PNG (default %(default)s)")
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
    ar.add_argument("--sizes", default="4K:256M", help="LOW:HIGH (powers of 4) or a list, e.g. 1M,16M (default %(default)s)")
    ar.add_argument("--repeats", type=int, default=5, help="timed repeats per size in each launch (median taken)")
    ar.add_argument("--rounds", type=int, default=3,
                    help="launches of every implementation, interleaved; the median over rounds is reported")
    ar.add_argument("--impls", default=",".join(ALLREDUCE_IMPLS), help="comma-separated (default: all)")
    ar.add_argument("--no-resnet", action="store_true", help="skip the ResNet-50 many-tensors case")
    _common(ar)
    ar.set_defaults(func=allreduce_command)

    from hvdkit.cli import bench_train

    bench_train.add_parser(kinds, _common)
    return parser


def allreduce_command(args: argparse.Namespace) -> int:
    if args.np < 1:
        raise UserError(f"-np {args.np} is not a process count: use 1 or more")
    if args.repeats < 1 or args.rounds < 1:
        raise UserError(f"--repeats {args.repeats} --rounds {args.rounds}: use 1 or more for both")
    sizes = parse_sizes(args.sizes)
    target = _target(args)
    build = _build()
    impls, skipped = available([i.strip() for i in args.impls.split(",") if i.strip()], build)
    worker = ["-m", "hvdkit.bench.allreduce", "--sizes", ",".join(map(str, sizes)), "--repeats", str(args.repeats)]
    if args.no_resnet:
        worker.append("--no-resnet")
    launches = [plan_horovodrun(impl, target, build, tuple(worker + ["--impl", impl])) for impl in impls]
    if args.dry_run:
        for launch in launches:
            print(launch.shell())
        return 0
    started = time.time()
    # Rounds of every implementation in turn: on a shared machine the noise
    # comes in bursts of seconds, which would otherwise hit one implementation.
    payloads, failures = run_launches(launches * args.rounds, args.timeout, desc="allreduce")
    rows = report.allreduce_rows(payloads)
    machine = report.machine_line(payloads[0]) if payloads else "?"
    title = f"allreduce, {args.np} processes on {len(target.hosts.hosts)} host(s); {machine}"
    data = results_data("allreduce", payloads, started, skipped, failures, rows, np=args.np,
                        hosts=target.hosts.names, rounds=args.rounds,
                        env={p["impl"]: p.get("env", {}) for p in payloads})
    return write_results(args, data, title, report.plot_allreduce, report.allreduce_table(rows))


def results_data(kind: str, payloads: list[dict], started: float, skipped: dict, failures: list[str],
                 rows: list[dict], **fields) -> dict:
    """The JSON a bench writes: what ran, on which machine, when, what was skipped or failed, and the rows."""
    return {"kind": kind, **fields, "machine": payloads[0]["machine"] if payloads else None,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)), "skipped": skipped,
            "failures": failures, "launches": [p["launch"] for p in payloads], "rows": rows}


def write_results(args: argparse.Namespace, data: dict, title: str, plot, table: str) -> int:
    """<kind>.json, .csv, .txt (the table) and .png under --out; the table (or --json) on stdout; failures on stderr, exit 1."""
    kind, rows = data["kind"], data["rows"]
    out = report.ensure_dir(args.out)
    report.write_json(os.path.join(out, f"{kind}.json"), data)
    report.write_csv(os.path.join(out, f"{kind}.csv"), rows)
    with open(os.path.join(out, f"{kind}.txt"), "w") as f:
        f.write(f"{title}\n{table}\n")
    if rows:
        plot(os.path.join(out, f"{kind}.png"), rows, title)
    if args.json:
        print(json.dumps(data))
    else:
        print(title)
        print(table)
        for impl, why in data["skipped"].items():
            print(f"skipped {impl}: {why}")
        print(f"wrote {out}/{kind}.csv, .json, .txt, .png")
    for failure in data["failures"]:
        print(f"hvdkit bench: error: {failure}", file=sys.stderr)
    return 1 if data["failures"] else 0
