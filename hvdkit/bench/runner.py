"""Plan, then run, one launch per implementation on the same hosts and process count.

Each launch is a :class:`BenchLaunch` (argv + extra environment) made by a
pure planning function, so tests and ``--dry-run`` can print exactly what
would run. :func:`run_launches` runs them one after another, each under a
timeout, and returns what rank 0 reported (see :mod:`hvdkit.bench.results`).
"""

from __future__ import annotations

import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from hvdkit.bench.catalog import CONTROLLER, MODELS, TRAIN_IMPLS
from hvdkit.bench.results import collect
from hvdkit.core.console import progress
from hvdkit.core.errors import UserError
from hvdkit.core.hosts import LOCAL_NAMES, HostSpec
from hvdkit.core.launch import BuildFlags, LaunchConfig, plan_launch
from hvdkit.core.remote import horovodrun_path
from hvdkit.core.topology import share_of_cores


@dataclass(frozen=True)
class BenchTarget:
    """Where every implementation runs: the same processes and hosts for all."""

    np: int
    hosts: HostSpec
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    network_interface: str | None = None
    python: str = sys.executable


@dataclass(frozen=True)
class BenchLaunch:
    impl: str
    argv: tuple[str, ...]
    env: dict = field(default_factory=dict)

    def shell(self) -> str:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{prefix} {shlex.join(self.argv)}".strip()


def _master_address(target: BenchTarget) -> str:
    first = target.hosts.hosts[0].name
    return "127.0.0.1" if first in LOCAL_NAMES else first


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def plan_horovodrun(impl: str, target: BenchTarget, build: BuildFlags, worker_argv: tuple[str, ...],
                    port: int | None = None) -> BenchLaunch:
    """The horovodrun command that runs ``worker_argv`` for ``impl`` (pure apart from ``port``)."""
    cfg = LaunchConfig(np=target.np, hosts=target.hosts, command=(target.python, *worker_argv),
                       controller=CONTROLLER[impl], ssh_port=target.ssh_port,
                       ssh_identity_file=target.ssh_identity_file, network_interface=target.network_interface,
                       horovodrun=horovodrun_path(target.python))
    plan = plan_launch(cfg, build)
    env = {}
    if impl == "torch":
        local = all(h.name in LOCAL_NAMES for h in target.hosts.hosts)
        env = {"MASTER_ADDR": _master_address(target),
               "MASTER_PORT": str(port or (_free_port() if local else random.randint(29500, 29999)))}
        if target.network_interface:
            env["GLOO_SOCKET_IFNAME"] = target.network_interface
    return BenchLaunch(impl, plan.argv, env)


def available(impls: list[str], build: BuildFlags) -> tuple[list[str], dict[str, str]]:
    """The implementations this Horovod build can run, and why the others cannot."""
    keep, skipped = [], {}
    for impl in impls:
        controller = CONTROLLER.get(impl)
        if controller is None:
            raise UserError(f"unknown implementation {impl!r}: use some of {', '.join(CONTROLLER)}")
        if controller == "mpi" and not build.mpi:
            skipped[impl] = "Horovod was built without MPI"
        elif controller == "gloo" and not build.gloo:
            skipped[impl] = "Horovod was built without Gloo"
        else:
            keep.append(impl)
    return keep, skipped


def plan_allreduce(target: BenchTarget, build: BuildFlags, impls: list[str], sizes: list[int], repeats: int,
                   resnet: bool = True) -> tuple[list[BenchLaunch], dict[str, str]]:
    """One launch of :mod:`hvdkit.bench.allreduce` per implementation this build can run; and the skipped ones."""
    keep, skipped = available(impls, build)
    worker = ("-m", "hvdkit.bench.allreduce", "--sizes", ",".join(map(str, sizes)), "--repeats", str(repeats),
              *(() if resnet else ("--no-resnet",)))
    return [plan_horovodrun(impl, target, build, (*worker, "--impl", impl)) for impl in keep], skipped


@dataclass(frozen=True)
class TrainBench:
    """What ``hvdkit bench train`` times: each model under each implementation, at each process count."""

    models: tuple[str, ...] = MODELS
    impls: tuple[str, ...] = TRAIN_IMPLS
    batch_size: int | None = None        # per process; default mnist 32, resnet50 16
    steps: int = 30
    warmup: int = 6
    image_size: int = 64


def plan_train(targets: list[BenchTarget], build: BuildFlags, bench: TrainBench) -> tuple[list[BenchLaunch], dict]:
    """Every (target, model, implementation) launch of :mod:`hvdkit.bench.train`, in run order; and the skipped."""
    for name in bench.models:
        if name not in MODELS:
            raise UserError(f"model {name!r} is unknown: use {' or '.join(MODELS)}")
    for impl in bench.impls:
        if impl not in TRAIN_IMPLS:
            raise UserError(f"implementation {impl!r} is unknown: use some of {', '.join(TRAIN_IMPLS)}")
    launches, skipped = [], {}
    for target in targets:
        # The same intra-op threads for every implementation: the host's cores
        # shared by its ranks (hvdkit's own default, made explicit so the
        # hand-written and DDP runs get it too).
        threads = {"OMP_NUM_THREADS": str(share_of_cores(min(target.np, target.hosts.hosts[0].slots)))}
        local = all(h.name in LOCAL_NAMES for h in target.hosts.hosts)
        for model in bench.models:
            batch = bench.batch_size or (32 if model == "mnist" else 16)
            worker = ("-m", "hvdkit.bench.train", "--model", model, "--batch-size", str(batch),
                      "--steps", str(bench.steps), "--warmup", str(bench.warmup), "--image-size", str(bench.image_size))
            for impl in bench.impls:
                if impl == "ddp" and not local:
                    skipped["ddp"] = "the torchrun comparison runs on this host only (-H localhost:N)"
                elif impl == "ddp":
                    argv = (target.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                            str(target.np), "-m", *worker[1:], "--impl", "ddp")
                    launches.append(BenchLaunch("ddp", argv, threads))
                else:
                    launch = plan_horovodrun("hvdkit" if impl == "hvdkit" else "horovod-auto", target, build,
                                             (*worker, "--impl", impl))
                    launches.append(BenchLaunch(impl, launch.argv, {**launch.env, **threads}))
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
        # stdout and stderr apart: merged, a stderr line can land inside a result line.
        proc = subprocess.Popen(launch.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
        try:
            output, errors = proc.communicate(timeout=timeout_s)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            # horovodrun and its local ranks share the new session: end them all,
            # so no rank outlives the bench (remote ranks end with their ssh).
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
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
