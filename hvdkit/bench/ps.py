"""A parameter server, for the benchmarks to measure against Horovod's ring.

The first process (launcher rank 0) is the server; every other process is a
worker. Each exchange, a worker sends its tensors, flattened into one buffer,
to the server and waits for the average; the server receives every worker's
buffer at once, sums them, scales by 1/workers and sends the result back to
each. So the server's link carries N buffers in, then N out, for N workers:
what :func:`hvdkit.ops.costmodel.parameter_server_s` predicts. It runs over
torch.distributed (Gloo) point-to-point, rendezvous at MASTER_ADDR:MASTER_PORT
(set by :mod:`hvdkit.bench.runner`).

This is the simplest synchronous server, as in the articles that compare it
with the ring: one server, one flat buffer per step, no sharding of the
parameters over several servers and no overlap with backward.

Example (under ``horovodrun --gloo -np 3 -H server:1,w1:1,w2:1``)::

    ps = ParameterServer.from_launcher()
    if ps.is_server:
        ps.serve_once([torch.empty(1000)])  # once per worker exchange, with the same shapes
    else:
        ps.average([grad])                  # in place
"""

from __future__ import annotations

import os

import torch

from hvdkit.bench.results import launcher_world


class ParameterServer:
    def __init__(self, rank: int, processes: int, address: str, port: str):
        import torch.distributed as dist

        if processes < 2:
            raise SystemExit("hvdkit bench: the parameter server needs -np 2 or more (the server, then the "
                             "workers): e.g. -np 3 -H server:1,worker1:1,worker2:1")
        dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=rank, world_size=processes)
        self.dist, self.rank = dist, rank
        self.is_server = rank == 0
        self.workers = processes - 1
        self._buffers: list[torch.Tensor] = []

    @classmethod
    def from_launcher(cls) -> ParameterServer:
        rank, size, _ = launcher_world()
        return cls(rank, size, os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])

    def average(self, tensors: list[torch.Tensor]) -> None:
        """On a worker: replace ``tensors`` by their average over the workers (one round trip to the server)."""
        flat = _flatten(tensors)
        self.dist.send(flat, dst=0)
        self.dist.recv(flat, src=0)
        _unflatten(flat, tensors)

    def serve_once(self, tensors: list[torch.Tensor]) -> None:
        """On the server: one exchange with every worker, for tensors shaped like ``tensors``."""
        numel = sum(t.numel() for t in tensors)
        if not self._buffers or self._buffers[0].numel() != numel:
            self._buffers = [torch.empty(numel, dtype=tensors[0].dtype) for _ in range(self.workers)]
        received = [self.dist.irecv(buf, src=w + 1) for w, buf in enumerate(self._buffers)]
        for work in received:
            work.wait()
        total = self._buffers[0]
        for buf in self._buffers[1:]:
            total.add_(buf)
        total.div_(self.workers)
        sent = [self.dist.isend(total, dst=w + 1) for w in range(self.workers)]
        for work in sent:
            work.wait()

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        self.dist.destroy_process_group()


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    if len(tensors) == 1 and tensors[0].is_contiguous():
        return tensors[0].view(-1)
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflatten(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    if len(tensors) == 1 and flat.data_ptr() == tensors[0].data_ptr():
        return
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
