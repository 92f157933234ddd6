"""Plan, then run, one launch per implementation on the same hosts and process count.

Each launch is a :class:`BenchLaunch` (argv + extra environment) made by a
pure planning function, so tests and ``--dry-run`` can print exactly what
would run. :func:`run_launches` runs them one after another, each under a
timeout, and returns what the reporting rank printed (rank 0; a parameter
server's first worker): see :mod:`hvdkit.bench.results`.
"""

from __future__ import annotations

import os
import random
import shlex
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from hvdkit.bench.catalog import MODELS, Implementation, check_models, implementations
from hvdkit.bench.results import collect
from hvdkit.common.console import progress
from hvdkit.ops.hosts import LOCAL_NAMES
from hvdkit.ops.launch import BuildFlags, LaunchTarget, plan_launch
from hvdkit.ops.procs import TIMED_OUT, run_bounded
from hvdkit.runtime.topology import share_of_cores


@dataclass(frozen=True)
class BenchLaunch:
    impl: str
    argv: tuple[str, ...]
    env: dict = field(default_factory=dict)

    def shell(self) -> str:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{prefix} {shlex.join(self.argv)}".strip()


def _loopback_only(target: LaunchTarget) -> bool:
    """Every rank on this machine, by launch's answer (``-H $(hostname):2`` too)."""
    return target.hosts.is_local_only()


def _master_address(target: LaunchTarget) -> str:
    first = target.hosts.hosts[0].name
    return "127.0.0.1" if first in LOCAL_NAMES or _loopback_only(target) else first


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def plan_horovodrun(impl: Implementation, target: LaunchTarget, build: BuildFlags, worker_argv: tuple[str, ...],
                    port: int | None = None) -> BenchLaunch:
    """The horovodrun command that runs ``worker_argv`` for ``impl`` (pure apart from ``port``)."""
    plan = plan_launch(target.launch_config((target.python, *worker_argv), impl.controller), build)
    env = {}
    if impl.framework in ("torch.distributed", "ps"):
        # horovodrun only starts the processes: torch.distributed meets at an address of its own
        # (the first host's, where the parameter server runs).
        port = port or (free_port() if _loopback_only(target) else random.randint(29500, 29999))
        env = {"MASTER_ADDR": _master_address(target), "MASTER_PORT": str(port)}
        if target.network_interface:
            env["GLOO_SOCKET_IFNAME"] = target.network_interface
    return BenchLaunch(impl.name, plan.argv, env)


def available(impls: Iterable[Implementation], build: BuildFlags) -> tuple[list[Implementation], dict[str, str]]:
    """The implementations this Horovod build can run, and why the others cannot."""
    keep, skipped = [], {}
    for impl in impls:
        if impl.controller == "mpi" and not build.mpi:
            skipped[impl.name] = "Horovod was built without MPI"
        elif impl.controller == "gloo" and not build.gloo:
            skipped[impl.name] = "Horovod was built without Gloo"
        else:
            keep.append(impl)
    return keep, skipped


@dataclass(frozen=True)
class AllreduceBench:
    """What ``hvdkit bench allreduce`` times: message sizes (bytes), and ResNet-50's tensors, per implementation."""

    sizes: tuple[int, ...]
    impls: tuple[Implementation, ...] = implementations("allreduce")
    repeats: int = 5                     # timed repeats per size in one launch
    resnet: bool = True
    iterations: int | None = None        # ops per timed repeat (default: more for small messages)


def plan_allreduce(target: LaunchTarget, build: BuildFlags,
                   bench: AllreduceBench) -> tuple[list[BenchLaunch], dict[str, str]]:
    """One launch of :mod:`hvdkit.bench.allreduce` per implementation this build can run; and the skipped ones."""
    keep, skipped = available(bench.impls, build)
    worker = ("-m", "hvdkit.bench.allreduce", "--sizes", ",".join(map(str, bench.sizes)),
              "--repeats", str(bench.repeats), *(() if bench.resnet else ("--no-resnet",)),
              *(("--iterations", str(bench.iterations)) if bench.iterations else ()))
    return [plan_horovodrun(impl, target, build, (*worker, "--impl", impl.name)) for impl in keep], skipped


@dataclass(frozen=True)
class TrainBench:
    """What ``hvdkit bench train`` times: each model under each implementation, at each process count."""

    models: tuple[str, ...] = MODELS
    impls: tuple[Implementation, ...] = implementations("train")
    batch_size: int | None = None        # per process; default mnist 32, resnet50 16
    steps: int = 30
    warmup: int = 6
    image_size: int = 64
    threads: int | None = None           # intra-op threads per process (default: the host's cores / its ranks)

    def __post_init__(self):
        check_models(self.models)


def plan_train(targets: list[LaunchTarget], build: BuildFlags, bench: TrainBench) -> tuple[list[BenchLaunch], dict]:
    """Every (target, model, implementation) launch of :mod:`hvdkit.bench.train`, in run order; and the skipped."""
    impls, skipped = available(bench.impls, build)
    launches = []
    for target in targets:
        # The same intra-op threads for every implementation: the host's cores
        # shared by its ranks (hvdkit's own default, made explicit so the
        # hand-written and DDP runs get it too), unless the bench says.
        threads = {"OMP_NUM_THREADS": str(bench.threads or
                                          share_of_cores(min(target.np, target.hosts.hosts[0].slots)))}
        for model in bench.models:
            batch = bench.batch_size or (32 if model == "mnist" else 16)
            worker = ("-m", "hvdkit.bench.train", "--model", model, "--batch-size", str(batch),
                      "--steps", str(bench.steps), "--warmup", str(bench.warmup), "--image-size", str(bench.image_size))
            for impl in impls:
                if impl.torchrun and not _loopback_only(target):
                    skipped[impl.name] = "the torchrun comparison runs on this host only (-H localhost:N)"
                elif impl.torchrun:
                    argv = (target.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                            str(target.np), *worker, "--impl", impl.name)
                    launches.append(BenchLaunch(impl.name, argv, threads))
                else:
                    launch = plan_horovodrun(impl, target, build, (*worker, "--impl", impl.name))
                    launches.append(BenchLaunch(impl.name, launch.argv, {**launch.env, **threads}))
    return launches, skipped


def _last_error(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line:
            return line[-300:]
    return (lines or ["(no output)"])[-1][-300:]


def run_launches(launches: list[BenchLaunch], timeout_s: float, desc: str = "bench") -> tuple[list[dict], list[str]]:
    """Run each launch (stdout captured, bounded by ``timeout_s``); the payloads and one line per failure."""
    payloads, failures = [], []
    for launch in progress(launches, rank=0, desc=desc):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"), **launch.env)
        start = time.monotonic()
        # horovodrun and its local ranks share a new session, ended whole on a timeout so no rank outlives the
        # bench (remote ranks end with their ssh).
        rc, output, errors = run_bounded(launch.argv, timeout_s, env=env, group=True)
        if rc == TIMED_OUT:
            failures.append(f"{launch.impl}: no result after {timeout_s:.0f}s (raise --timeout, or check the hosts "
                            f"with 'hvdkit doctor')")
            continue
        payload = collect(output)
        if rc != 0 or payload is None:
            failures.append(f"{launch.impl}: exit {rc}: {_last_error(output + errors)}")
            continue
        payload["launch"] = {"argv": list(launch.argv), "env": launch.env,
                             "seconds": round(time.monotonic() - start, 1)}
        payloads.append(payload)
    return payloads, failures
