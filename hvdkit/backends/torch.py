"""The torch backend: ``horovod.torch`` collectives, CUDA pinning and seeds for torch tensors.

Example::

    backend = TorchBackend()
    backend.allreduce_floats([correct, seen], "sum", name="eval")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from hvdkit.backends import import_horovod
from hvdkit.runtime import cuda_driver
from hvdkit.runtime.backend import Backend
from hvdkit.runtime.topology import GPUView, pin_gpu

hvd = import_horovod("horovod.torch", "hvdkit")


class TorchBackend(Backend):
    name = "torch"
    framework = "torch"
    hvd = hvd

    def has_gpu(self) -> bool:
        return torch.cuda.is_available()

    def cuda_build(self) -> str | None:
        return torch.version.cuda

    def pin(self, rank: int, local_rank: int, local_size: int, use_gpu: bool = True):
        # device_count() and the properties are already filtered by CUDA_VISIBLE_DEVICES.
        uuids = cuda_driver.torch_gpu_uuids(torch) if use_gpu and torch.cuda.is_available() else ()
        view = GPUView.here(rank, local_rank, local_size, uuids, use_gpu)
        gpu = pin_gpu(view, lambda v: self.allgather_object(v, name="hvdkit.gpus"), torch.cuda.set_device)
        return gpu, torch.device("cpu") if gpu is None else torch.device("cuda", gpu)

    def set_threads(self, threads: int) -> bool:
        torch.set_num_threads(threads)
        return True

    def seed(self, value: int) -> None:
        torch.manual_seed(value)

    def allreduce_floats(self, values: Sequence[float], op: str, name: str) -> list[float]:
        tensor = torch.as_tensor(values, dtype=torch.float64).detach().cpu()
        return hvd.allreduce(tensor, op=self.reduce_op(op), name=name).tolist()

    def broadcast_tensors(self, named: Sequence[tuple[str, torch.Tensor]], root_rank: int) -> list[torch.Tensor]:
        # In place and asynchronous, as Horovod's broadcast_parameters: every broadcast is
        # queued before the first wait, so Horovod can fuse them.
        with torch.no_grad():
            handles = [hvd.broadcast_async_(t, root_rank, name=f"hvdkit.bcast.{n}") for n, t in named]
            for handle in handles:
                hvd.synchronize(handle)
        return [t for _, t in named]

    def allreduce(self, tensor, op: str, name: str | None = None):
        return hvd.allreduce(tensor, op=self.reduce_op(op), name=name)

    def grouped_allreduce(self, tensors: Sequence[torch.Tensor], op: str, compression: str = "none") -> list:
        return hvd.grouped_allreduce(list(tensors), op=self.reduce_op(op), compression=self.compression(compression))

    def grouped_allgather(self, tensors: Sequence[torch.Tensor], name: str) -> list[torch.Tensor]:
        return hvd.grouped_allgather(list(tensors), name=name) if tensors else []

    def start_grouped_allgather(self, tensors: Sequence[torch.Tensor],
                                name: str) -> Callable[[], list[torch.Tensor]]:
        if not tensors:
            return lambda: []
        handle = hvd.grouped_allgather_async(list(tensors), name=name)
        return lambda: hvd.synchronize(handle)

    def gather_to(self, root: int, tensors: Sequence[torch.Tensor], name: str) -> list[torch.Tensor]:
        # Every alltoall is started before the first is waited for: what root receives is each tensor whole.
        handles = []
        for n, piece in enumerate(tensors):
            splits = torch.zeros(hvd.size(), dtype=torch.int32)
            splits[root] = piece.numel()
            handles.append(hvd.alltoall_async(piece, splits=splits, name=f"{name}.{n}"))
        gathered = [hvd.synchronize(h)[0] for h in handles]
        return gathered if hvd.rank() == root else []
