"""`hvdkit plan`: the cost model's step time and scaling efficiency, before renting the GPUs.

    hvdkit plan --params 25.6M --compute-ms 250 --bandwidth 12.5 --latency 10 --gpus 16,512
    hvdkit plan --calibrate bench-results --model resnet50     # B and latency (and compute) from hvdkit bench

The cost model (see hvdkit.ops.costmodel): ring 2(N-1)/N*K/B + 2(N-1)*latency
against a parameter server's 2N*K/B (on a host of its own), plus compute with optional overlap.
The command keeps the name users know; it plans capacity, not a launch (that
is ``hvdkit launch``'s :func:`hvdkit.ops.launch.plan_launch`).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from hvdkit.argtypes import non_negative_float, positive_float
from hvdkit.bench.calibrate import calibrate_network, train_compute
from hvdkit.common.console import text_table
from hvdkit.common.errors import UserError
from hvdkit.common.units import format_bytes, parse_count
from hvdkit.ops.costmodel import RESNET50_PARAMS, Network, Workload, predict, ring_allreduce_s
from hvdkit.ops.plots import plot_cost_model


@dataclass(frozen=True)
class CostModelConfig:
    gpus: tuple[int, ...]                # worker counts to predict, ascending
    params: float | None = None          # None: from --calibrate's train.json, else ResNet-50's
    bytes_per_param: float = 4
    compute_s: float | None = None       # one worker's step without communication
    bandwidth: float | None = None       # GB/s per link and direction
    latency: float | None = None         # microseconds per message
    overlap: float = 0.0
    calibrate: str | None = None         # a hvdkit bench --out directory
    impl: str = "hvdkit"
    model: str = "resnet50"
    plot: str | None = None
    json: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CostModelConfig:
        gpus = tuple(sorted({int(g) for g in args.gpus.split(",") if g.strip()}))
        if not gpus or gpus[0] < 1:
            raise UserError(f"--gpus {args.gpus!r}: give worker counts of 1 or more, e.g. 1,8,16,512")
        # None means "not given" (then a default or --calibrate fills it); 0 is refused, never replaced.
        return cls(gpus=gpus, params=parse_count(args.params) if args.params is not None else None,
                   bytes_per_param=args.bytes_per_param,
                   compute_s=args.compute_ms / 1e3 if args.compute_ms is not None else None, bandwidth=args.bandwidth,
                   latency=args.latency, overlap=args.overlap, calibrate=args.calibrate, impl=args.impl,
                   model=args.model, plot=args.plot, json=args.json)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("plan", help="predict step time and scaling: ring-allreduce vs parameter server",
                       description="First-principles cost model for data-parallel training; "
                                   "--calibrate fits it to hvdkit bench results.")
    p.add_argument("--params", default=None, help="model parameters, e.g. 25.6M (default: ResNet-50, "
                                                  f"{RESNET50_PARAMS:,})")
    p.add_argument("--bytes-per-param", type=positive_float, default=4,
                   help="gradient bytes per parameter (4 fp32, 2 fp16)")
    p.add_argument("--compute-ms", type=positive_float, default=None,
                   help="one worker's step without communication (ms)")
    p.add_argument("--bandwidth", type=positive_float, default=None,
                   help="link bandwidth, GB/s per direction (12.5 = 100 Gb/s)")
    p.add_argument("--latency", type=non_negative_float, default=None, help="per-message latency, microseconds")
    p.add_argument("--overlap", type=non_negative_float, default=0.0,
                   help="share of compute that hides communication, 0..1")
    p.add_argument("--gpus", default="1,2,4,8,16,32,64,128,256,512", help="worker counts to predict")
    p.add_argument("--calibrate", metavar="DIR", help="hvdkit bench --out directory: fit bandwidth/latency to "
                                                      "allreduce.json, take compute from train.json")
    p.add_argument("--impl", default="hvdkit", help="which implementation's bench rows to calibrate on")
    p.add_argument("--model", default="resnet50", help="train.json model to take compute and params from")
    p.add_argument("--plot", default=None, help="write a PNG of efficiency vs workers here")
    p.add_argument("--json", action="store_true", help="print the predictions as JSON")
    p.set_defaults(config=CostModelConfig.from_args, run=run)
    return p


def run(config: CostModelConfig) -> int:
    notes, check = [], None
    params = RESNET50_PARAMS if config.params is None else config.params
    compute_s = config.compute_s
    if config.calibrate:
        net, params, compute_s, check = _calibrate(config, compute_s, notes)
    else:
        net = Network((12.5 if config.bandwidth is None else config.bandwidth) * 1e9,
                      (10.0 if config.latency is None else config.latency) * 1e-6)
    if compute_s is None:
        raise UserError("no compute time: give --compute-ms (one worker's step without communication), "
                        "or --calibrate a directory that has train.json from hvdkit bench train")
    work = Workload(grad_bytes=params * config.bytes_per_param, compute_s=compute_s, overlap=config.overlap)
    preds = [predict(work, net, n) for n in config.gpus]
    assumptions = {"params": params, "grad_bytes": work.grad_bytes, "compute_ms": compute_s * 1e3,
                   "bandwidth_GBps": net.bandwidth / 1e9, "latency_us": net.latency * 1e6, "overlap": config.overlap,
                   "notes": notes}
    if config.plot:
        plot_cost_model(config.plot, preds, assumptions)
    if config.json:
        print(json.dumps({"assumptions": assumptions, "predictions": [p.as_dict() for p in preds], "check": check}))
        return 0
    _print_predictions(assumptions, preds, check)
    if config.plot:
        print(f"wrote {config.plot}")
    return 0


def _calibrate(config: CostModelConfig, compute_s: float | None,
               notes: list[str]) -> tuple[Network, float, float | None, dict | None]:
    """The network fitted to the bench sweep in --calibrate (then --bandwidth/--latency override it); params
    and compute from its train.json where not given; and the check of the model against that measured step.

    Returns (network, params, compute seconds, check or None); appends what it took from where to ``notes``.
    """
    check, params = None, RESNET50_PARAMS if config.params is None else config.params
    net, fitted_np = calibrate_network(config.calibrate, config.impl)
    notes.append(f"bandwidth and latency fitted to {config.impl}'s allreduce sweep on {fitted_np} processes")
    row = train_compute(config.calibrate, config.impl, config.model)
    if row:
        measured_comm = row["allreduce_ms"] / 1e3
        local = (row["step_ms"] - row["allreduce_ms"]) / 1e3
        if config.params is None:
            params = row["params"]
        if compute_s is None:
            compute_s = local
            notes.append(f"compute {local * 1e3:.1f} ms = measured {config.model} step minus its allreduce wait "
                         f"({config.impl}, np={row['np']})")
        predicted = compute_s + ring_allreduce_s(params * config.bytes_per_param, row["np"], net)
        check = {"np": row["np"], "model": config.model, "measured_step_ms": row["step_ms"],
                 "predicted_step_ms": predicted * 1e3,
                 "error": predicted * 1e3 / row["step_ms"] - 1, "measured_allreduce_ms": measured_comm * 1e3}
    if config.bandwidth is not None:
        net = Network(config.bandwidth * 1e9, net.latency)
    if config.latency is not None:
        net = Network(net.bandwidth, config.latency * 1e-6)
    return net, params, compute_s, check


def _print_predictions(assumptions: dict, preds: list, check: dict | None) -> None:
    """The cost model's answer as text: the assumptions, one row per worker count, and the check against
    bench train."""
    a = assumptions
    print(f"model: {a['params'] / 1e6:.1f} M params, {format_bytes(a['grad_bytes'])} of gradients per step; "
          f"compute {a['compute_ms']:.1f} ms/step; overlap {a['overlap']:.0%}")
    print(f"network: {a['bandwidth_GBps']:.3g} GB/s per link, {a['latency_us']:.3g} us per message")
    for note in a["notes"]:
        print(f"  ({note})")
    header = ["workers", "ring ms", "ring step", "ring eff", "PS ms", "PS step", "PS eff"]
    lines = [header] + [[str(p.workers), f"{p.ring_comm_s * 1e3:.1f}", f"{p.ring_step_s * 1e3:.1f}",
                         f"{p.ring_efficiency:.0%}", f"{p.ps_comm_s * 1e3:.1f}", f"{p.ps_step_s * 1e3:.1f}",
                         f"{p.ps_efficiency:.0%}"] for p in preds]
    print(text_table(lines))
    if check:
        print(f"check against bench train ({check['model']}, np={check['np']}): predicted "
              f"{check['predicted_step_ms']:.1f} ms/step, measured {check['measured_step_ms']:.1f} ms "
              f"({check['error']:+.0%})")
