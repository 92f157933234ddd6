"""`hvdkit bench train`: samples/s and the time split of one training step, hvdkit vs its peers.

    hvdkit bench train -np 1,2                               # mnist and resnet50, 3 implementations
    hvdkit bench train -np 2 --models resnet50 --impls hvdkit,horovod
"""

from __future__ import annotations

import argparse
import sys
import time

from hvdkit.bench import report
from hvdkit.bench.runner import BenchLaunch, BenchTarget, plan_horovodrun, run_launches
from hvdkit.bench.train_report import plot_train, train_rows, train_table
from hvdkit.core.errors import UserError
from hvdkit.core.hosts import LOCAL_NAMES
from hvdkit.core.topology import share_of_cores

TRAIN_IMPLS = ("hvdkit", "horovod", "ddp")


def add_parser(kinds: argparse._SubParsersAction, common) -> None:
    tr = kinds.add_parser("train", help="training throughput and time split: hvdkit vs Horovod by hand vs torchrun+DDP")
    tr.add_argument("-np", "--num-proc", dest="np_list", default="2",
                    help="process counts, e.g. 1,2 (scaling efficiency is reported against the first)")
    tr.add_argument("--models", default="mnist,resnet50", help="mnist (the example's convnet), resnet50 (synthetic images)")
    tr.add_argument("--impls", default=",".join(TRAIN_IMPLS), help="comma-separated (default: all)")
    tr.add_argument("--batch-size", type=int, default=None, help="per process (default: mnist 32, resnet50 16)")
    tr.add_argument("--repeats", type=int, default=3, help="runs of each launch, interleaved; medians reported")
    tr.add_argument("--steps", type=int, default=30, help="timed steps per run (default %(default)s)")
    tr.add_argument("--warmup", type=int, default=6, help="untimed steps first (default %(default)s)")
    tr.add_argument("--image-size", type=int, default=64, help="resnet50 input side (default %(default)s)")
    common(tr)
    tr.set_defaults(func=command, np=None)


def _np_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"-np {text!r} is not a list of process counts: write e.g. -np 2 or -np 1,2,4") from None
    if not values or min(values) < 1:
        raise UserError(f"-np {text!r}: process counts must be 1 or more")
    return values


def plan_train(args: argparse.Namespace, build, python: str = sys.executable) -> tuple[list[BenchLaunch], dict]:
    """Every (process count, model, implementation) launch, in the order they run; and what was skipped."""
    from hvdkit.cli.bench import _target

    launches, skipped = [], {}
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    for name in models:
        if name not in ("mnist", "resnet50"):
            raise UserError(f"model {name!r} is unknown: use mnist or resnet50")
    for impl in impls:
        if impl not in TRAIN_IMPLS:
            raise UserError(f"implementation {impl!r} is unknown: use some of {', '.join(TRAIN_IMPLS)}")
    for np in _np_list(args.np_list):
        args.np = np
        target: BenchTarget = _target(args)
        # The same intra-op threads for every implementation: the host's cores
        # shared by its ranks (hvdkit's own default, made explicit so the
        # hand-written and DDP runs get it too).
        threads = {"OMP_NUM_THREADS": str(share_of_cores(min(np, target.hosts.hosts[0].slots)))}
        for model in models:
            batch = args.batch_size or (32 if model == "mnist" else 16)
            worker = ("-m", "hvdkit.bench.train", "--model", model, "--batch-size", str(batch),
                      "--steps", str(args.steps), "--warmup", str(args.warmup), "--image-size", str(args.image_size))
            for impl in impls:
                if impl == "ddp":
                    if not all(h.name in LOCAL_NAMES for h in target.hosts.hosts):
                        skipped["ddp"] = "the torchrun comparison runs on this host only (-H localhost:N)"
                        continue
                    argv = (python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(np),
                            "-m", *worker[1:], "--impl", "ddp")
                    launches.append(BenchLaunch("ddp", argv, threads))
                else:
                    launch = plan_horovodrun("hvdkit" if impl == "hvdkit" else "horovod-auto", target, build,
                                             (*worker, "--impl", impl))
                    launches.append(BenchLaunch(impl, launch.argv, {**launch.env, **threads}))
    return launches, skipped


def command(args: argparse.Namespace) -> int:
    from hvdkit.cli.bench import _build, results_data, write_results

    build = _build()
    launches, skipped = plan_train(args, build)
    if args.dry_run:
        for launch in launches:
            print(launch.shell())
        return 0
    started = time.time()
    if args.repeats < 1:
        raise UserError(f"--repeats {args.repeats}: use 1 or more")
    # Rounds of every launch in turn, so slow drift on a shared machine hits all implementations alike.
    payloads, failures = run_launches(launches * args.repeats, args.timeout, desc="train")
    rows = train_rows(payloads)
    machine = report.machine_line(payloads[0]) if payloads else "?"
    data = results_data("train", payloads, started, skipped, failures, rows, np=_np_list(args.np_list))
    return write_results(args, data, f"training step; {machine}", plot_train, train_table(rows))
