"""A first-principles cost model: ring-allreduce vs parameter server, per training step.

For N workers each holding K bytes of gradients on links of bandwidth B
(bytes/s) with per-message latency a:

- ring-allreduce (Horovod, NCCL): reduce-scatter then allgather, 2(N-1)
  steps each moving K/N bytes per link::

      t_ring = 2(N-1)/N * K/B + 2(N-1) * a

  The bytes per worker stay near 2K however large N grows.
- parameter server (one server on a host of its own; the workers push
  gradients and pull the average back): the server's link carries every
  worker's K in, then every worker's K out::

      t_ps = 2N * K/B + 2a

  (With the server on one of the workers' hosts its own K stays local:
  2(N-1) * K/B. hvdkit's earlier model used that form; the study in
  docs/BENCHMARKS.md measures a server on its own host.)

A step takes ``compute + max(0, t_comm - overlap * compute)`` where
``overlap`` is the fraction of compute that communication can hide behind
(backward runs while earlier layers' gradients are already on the wire).
Scaling efficiency is step(1) / step(N) at a fixed per-worker batch.

Example::

    net = Network(bandwidth=12.5e9, latency=10e-6)          # 100 Gb/s, 10 us
    work = Workload(grad_bytes=25_557_032 * 4, compute_s=0.25)
    predict(work, net, 16).ring_efficiency                  # 0.94...
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from hvdkit.common.errors import UserError

RESNET50_PARAMS = 25_557_032   # torchvision resnet50, the default model to plan for


@dataclass(frozen=True)
class Network:
    bandwidth: float  # bytes/s per link, each direction
    latency: float    # seconds per message

    def __post_init__(self):
        if not 0 < self.bandwidth < math.inf:        # written so that nan fails too
            raise UserError(f"bandwidth {self.bandwidth:g} B/s must be positive and finite: "
                            "e.g. --bandwidth 12.5 (GB/s, 100 Gb/s)")
        if not 0 <= self.latency < math.inf:
            raise UserError(f"latency {self.latency:g} s must be 0 or more and finite: "
                            "e.g. --latency 10 (microseconds)")


@dataclass(frozen=True)
class Workload:
    grad_bytes: float  # gradient bytes allreduced per step
    compute_s: float   # one worker's step without communication (input, forward, backward, update)
    overlap: float = 0.0

    def __post_init__(self):
        if not (0 < self.grad_bytes < math.inf and 0 < self.compute_s < math.inf):   # nan fails too
            raise UserError(f"gradient bytes ({self.grad_bytes:g}) and compute time ({self.compute_s:g} s) must be "
                            "positive and finite: give --params and --compute-ms, or --calibrate a bench directory")
        if not 0 <= self.overlap <= 1:
            raise UserError(f"overlap {self.overlap:g} must lie in 0..1 "
                            "(the share of compute that hides communication)")


@dataclass(frozen=True)
class Prediction:
    workers: int
    ring_comm_s: float
    ring_step_s: float
    ring_efficiency: float
    ps_comm_s: float
    ps_step_s: float
    ps_efficiency: float

    def as_dict(self) -> dict:
        return asdict(self)


def ring_allreduce_s(nbytes: float, workers: int, net: Network) -> float:
    if workers <= 1:
        return 0.0
    return 2 * (workers - 1) / workers * nbytes / net.bandwidth + 2 * (workers - 1) * net.latency


def parameter_server_s(nbytes: float, workers: int, net: Network) -> float:
    """One exchange through a server on its own host; 0 for one worker, who trains alone (the step(1) baseline)."""
    if workers <= 1:
        return 0.0
    return 2 * workers * nbytes / net.bandwidth + 2 * net.latency


def step_s(work: Workload, comm_s: float) -> float:
    return work.compute_s + max(0.0, comm_s - work.overlap * work.compute_s)


def predict(work: Workload, net: Network, workers: int) -> Prediction:
    ring = ring_allreduce_s(work.grad_bytes, workers, net)
    ps = parameter_server_s(work.grad_bytes, workers, net)
    ring_step, ps_step = step_s(work, ring), step_s(work, ps)
    return Prediction(workers, ring, ring_step, work.compute_s / ring_step, ps, ps_step, work.compute_s / ps_step)


def fit_network(points: list[tuple[float, float]], workers: int) -> Network:
    """Bandwidth and latency from measured (bytes, seconds) allreduce points of a ``workers``-process ring.

    Fits t = c + s*K by least squares on relative error (so 4 KiB points
    count as much as 256 MiB ones), then reads B = 2(N-1)/N / s and
    a = c / (2(N-1)) off the ring formula.
    """
    if workers < 2:
        raise UserError("calibration needs an allreduce bench with 2 or more processes: run hvdkit bench "
                        "allreduce -np 2")
    pts = [(k, t) for k, t in points if t > 0]
    if len(pts) < 2:
        raise UserError("calibration needs at least 2 message sizes: run hvdkit bench allreduce with --sizes 4K:256M")
    # weighted least squares, weight 1/t^2
    sw = sx = sy = sxx = sxy = 0.0
    for k, t in pts:
        w = 1.0 / (t * t)
        sw, sx, sy, sxx, sxy = sw + w, sx + w * k, sy + w * t, sxx + w * k * k, sxy + w * k * t
    det = sw * sxx - sx * sx
    slope = (sw * sxy - sx * sy) / det if det else 0.0
    intercept = (sy - slope * sx) / sw
    if slope <= 0:
        raise UserError("the allreduce times do not grow with message size, so no bandwidth can be fitted: "
                        "rerun hvdkit bench allreduce with larger --sizes and more --repeats")
    return Network(bandwidth=2 * (workers - 1) / workers / slope, latency=max(intercept, 0.0) / (2 * (workers - 1)))
