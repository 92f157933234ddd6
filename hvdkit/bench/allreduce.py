"""Allreduce benchmark worker: one implementation per launch, results from rank 0 (a parameter server's: rank 1).

Launched by ``hvdkit bench allreduce`` (see :mod:`hvdkit.bench.runner`) as
``python -m hvdkit.bench.allreduce --impl NAME``. The implementations are
those of :data:`hvdkit.bench.catalog.CATALOG` for this bench; each one's
framework picks the :class:`Comm` below. The gap between ``mpi4py-avg`` (raw
MPI's sum, then one scale by 1/size) and ``mpi4py`` is the cost of averaging
itself, and the gap from ``hvdkit`` to ``mpi4py-avg`` is Horovod's own.

Cases: a message-size ``sweep``, and ResNet-50's 161 parameter tensors
allreduced together (``resnet50-many``) next to one tensor of the same total
bytes (``resnet50-one``), which shows what tensor fusion recovers.
"""

from __future__ import annotations

import argparse
import os
import time
from abc import ABC, abstractmethod

import torch

from hvdkit.bench.catalog import Implementation, every_implementation, implementation
from hvdkit.bench.models import resnet50_shapes
from hvdkit.bench.results import emit, launcher_world, machine, pin_cuda


def iterations(nbytes: int) -> int:
    """Ops per timed repeat: many for small messages (latency-bound), few for large ones."""
    return max(3, min(100, (512 << 20) // max(nbytes, 1)))


class Comm(ABC):
    """One implementation's allreduce of a list of tensors, barrier and identity."""

    name = ""
    rank = size = 0               # size: the processes that reduce (a parameter server's workers)
    device = torch.device("cpu")

    @property
    def reports(self) -> bool:
        """Whether this process prints the results."""
        return self.rank == 0

    @abstractmethod
    def allreduce(self, tensors: list[torch.Tensor]) -> None:
        """Sum or average ``tensors`` in place across all ranks; return when done."""

    @abstractmethod
    def barrier(self) -> None:
        """Return once every rank has reached it."""

    @abstractmethod
    def close(self) -> None:
        """Shut the library down cleanly on every rank."""


class HorovodComm(Comm):
    """Horovod's in-place allreduce_async_: after hvdkit.torch.init() (framework "hvdkit") or a plain hvd.init()."""

    def __init__(self, impl: Implementation):
        if impl.framework == "hvdkit":
            import hvdkit.torch as hk

            ctx = hk.init()
            self.device = ctx.device
            hvd = hk.hvd
        else:
            import horovod.torch as hvd

            hvd.init()
            torch.set_num_threads(1)  # what Horovod's own examples do on CPU
            gpu = pin_cuda(hvd.local_rank(), torch.cuda)
            if gpu is not None:
                self.device = torch.device("cuda", gpu)
        self.hvd, self.name, self.rank, self.size = hvd, impl.name, hvd.rank(), hvd.size()
        self.controller = "mpi" if hvd.mpi_enabled() and not hvd.gloo_enabled() else "gloo"

    def allreduce(self, tensors):
        hvd = self.hvd
        handles = [hvd.allreduce_async_(t, op=hvd.Average, name=f"bench.{i}.{t.numel()}")
                   for i, t in enumerate(tensors)]
        for handle in handles:
            hvd.synchronize(handle)

    def barrier(self):
        self.hvd.barrier()

    def close(self):
        self.hvd.shutdown()


class TorchComm(Comm):
    """torch.distributed with rendezvous at MASTER_ADDR:MASTER_PORT (set by the runner)."""

    def __init__(self, impl: Implementation):
        import torch.distributed as dist

        env = os.environ
        self.rank, self.size, local_rank = launcher_world()
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        gpu = pin_cuda(local_rank, torch.cuda)
        if gpu is not None:
            self.device = torch.device("cuda", gpu)
        torch.set_num_threads(1)
        dist.init_process_group(backend, init_method=f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
                                rank=self.rank, world_size=self.size)
        self.dist, self.name, self.controller = dist, f"torch-{backend}", backend

    def allreduce(self, tensors):
        works = [self.dist.all_reduce(t, async_op=True) for t in tensors]
        for work in works:
            work.wait()

    def barrier(self):
        self.dist.barrier()

    def close(self):
        self.dist.destroy_process_group()


class MpiComm(Comm):
    """Raw MPI: a sum in place; with ``average``, then one in-place scale (what averaging costs at least)."""

    def __init__(self, impl: Implementation):
        from mpi4py import MPI

        self.MPI, self.comm, self.average, self.name = MPI, MPI.COMM_WORLD, impl.average, impl.name
        self.rank, self.size, self.controller = self.comm.rank, self.comm.size, "mpi"

    def allreduce(self, tensors):
        for t in tensors:
            self.comm.Allreduce(self.MPI.IN_PLACE, t.numpy())
            if self.average:
                t.div_(self.size)

    def barrier(self):
        self.comm.Barrier()

    def close(self):
        self.MPI.Finalize()


class ParameterServerComm(Comm):
    """:class:`hvdkit.bench.ps.ParameterServer`: the first process serves, the others' tensors are averaged."""

    def __init__(self, impl: Implementation):
        from hvdkit.bench.ps import ParameterServer

        torch.set_num_threads(1)
        self.ps = ParameterServer.from_launcher()
        self.name, self.controller = impl.name, "gloo"
        self.rank, self.size = self.ps.rank, self.ps.workers

    @property
    def reports(self) -> bool:
        return self.rank == 1       # the first worker: the server's clock is not a worker's

    def allreduce(self, tensors):
        if self.ps.is_server:
            self.ps.serve_once(tensors)
        else:
            self.ps.average(tensors)

    def barrier(self):
        self.ps.barrier()

    def close(self):
        self.ps.close()


COMMS = {"hvdkit": HorovodComm, "horovod": HorovodComm, "torch.distributed": TorchComm, "mpi4py": MpiComm,
         "ps": ParameterServerComm}


def make_comm(impl: Implementation) -> Comm:
    return COMMS[impl.framework](impl)


def timed(comm: Comm, tensors: list[torch.Tensor], iters: int, repeats: int) -> list[float]:
    """Seconds per allreduce of ``tensors``, one number per repeat, after two warm-up rounds."""
    for _ in range(2):
        comm.allreduce(tensors)
    times = []
    for _ in range(repeats):
        comm.barrier()
        if comm.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            comm.allreduce(tensors)
        if comm.device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / iters)
    return times


def run(comm: Comm, sizes: list[int], repeats: int, resnet: bool, iters: int | None = None) -> list[dict]:
    rows = []

    def record(case: str, tensors: list[torch.Tensor], times: list[float]) -> None:
        rows.append({"impl": comm.name, "case": case, "bytes": sum(t.numel() * 4 for t in tensors),
                     "tensors": len(tensors), "times_s": times})

    for nbytes in sizes:
        t = torch.ones(max(nbytes // 4, 1), device=comm.device)
        record("sweep", [t], timed(comm, [t], iters or iterations(nbytes), repeats))
        del t
    if resnet:
        shapes = resnet50_shapes()
        many = [torch.ones(s, device=comm.device) for s in shapes]
        total = sum(t.numel() for t in many)
        record("resnet50-many", many, timed(comm, many, iters or 3, repeats))
        del many
        one = torch.ones(total, device=comm.device)
        record("resnet50-one", [one], timed(comm, [one], iters or 3, repeats))
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="allreduce benchmark worker (run by hvdkit bench allreduce)")
    p.add_argument("--impl", required=True, choices=[i.name for i in every_implementation("allreduce")])
    p.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-resnet", action="store_true")
    p.add_argument("--iterations", type=int, default=None, help="ops per timed repeat (default: by size)")
    args = p.parse_args(argv)
    comm = make_comm(implementation("allreduce", args.impl))
    rows = run(comm, [int(s) for s in args.sizes.split(",") if s], args.repeats, not args.no_resnet, args.iterations)
    if comm.reports:
        emit({"impl": args.impl, "label": comm.name, "controller": comm.controller, "np": comm.size,
              "device": comm.device.type, "machine": machine(), "rows": rows,
              "env": {k: v for k, v in os.environ.items() if k in TUNING_KEYS}})
    comm.close()


TUNING_KEYS = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY", "HOROVOD_THREAD_AFFINITY",
               "OMPI_MCA_mpi_yield_when_idle", "HOROVOD_BLOCKING_WAIT")

if __name__ == "__main__":
    main()
