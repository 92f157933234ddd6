"""Steps 1 and 2: initialise Horovod and pin this process to its device.

Example::

    import hvdkit.torch as hk
    ctx = hk.init(seed=42)
    model = Net().to(ctx.device)
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import numpy as np
import torch

from hvdkit.core import cuda_driver, slurm
from hvdkit.core.topology import GPUView, Topology, cpu_threads_per_rank, pin_gpu
from hvdkit.core.tuning import apply_horovod_defaults
from hvdkit.torch._horovod import hvd


@dataclass(frozen=True)
class Context(Topology):
    """Where this process sits in the job (see :class:`hvdkit.core.topology.Topology`) and its ``torch.device``."""

    device: torch.device = torch.device("cpu")


_context: Context | None = None


def init(seed: int | None = None, threads: int | None = None) -> Context:
    """Initialise Horovod, pin this rank's own GPU (or use the CPU), set threads and seeds.

    The GPU is the local rank's when every rank of the host sees all its GPUs,
    else the first visible one (a launcher that gives each rank its own); the
    ranks compare the GPUs' UUIDs first and raise :class:`hvdkit.core.topology.NoGPUError` if two
    would share one (see :func:`hvdkit.core.topology.check_gpu_choice`), or
    if the host has GPUs that torch cannot use (an old driver).

    ``seed`` seeds Python, numpy and torch with ``seed + rank`` (see
    :func:`seed_everything`); the model still starts identical on every rank
    because :func:`broadcast_state` copies rank 0's weights.
    ``threads`` is the intra-op thread count; by default the host's cores are
    shared among its local ranks so that N processes don't each spawn a
    thread per core and thrash (unless OMP_NUM_THREADS is set).
    """
    global _context
    cuda = torch.cuda.is_available()
    apply_horovod_defaults(on_gpu=cuda)  # measured (hvdkit.core.tuning); the environment wins
    slurm.check_direct_launch(os.environ, mpi_built=bool(hvd.mpi_built()))   # srun without PMIx: say the fix
    cuda_driver.check_cuda_usable(cuda, "torch", torch.version.cuda)   # GPUs torch cannot use: say why
    hvd.init()
    local_rank, local_size = hvd.local_rank(), hvd.local_size()
    if cuda:
        # device_count() and the properties are already filtered by CUDA_VISIBLE_DEVICES.
        uuids = cuda_driver.torch_gpu_uuids(torch)
        view = GPUView.here(hvd.rank(), local_rank, local_size, uuids)
        gpu = pin_gpu(view, lambda v: hvd.allgather_object(v, name="hvdkit.gpus"), torch.cuda.set_device)
        device = torch.device("cuda", gpu)
    else:
        gpu, device = None, torch.device("cpu")
    if threads is None and device.type == "cpu":
        threads = cpu_threads_per_rank(local_size)
    if threads is not None:
        torch.set_num_threads(threads)
    _context = Context(
        rank=hvd.rank(), size=hvd.size(), local_rank=local_rank, local_size=local_size,
        cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(), gpu=gpu, device=device,
    )
    if seed is not None:
        seed_everything(seed, rank=_context.rank)
    return _context


def refresh() -> Context:
    """Re-read rank and size after Horovod re-initialised (an elastic reset); the device stays."""
    global _context
    if _context is None:
        raise RuntimeError("hvdkit.torch.init() has not been called: call ctx = hvdkit.torch.init() at the top "
                           "of your script")
    _context = Context(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
                       cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(), gpu=_context.gpu,
                       device=_context.device)
    return _context


def current() -> Context:
    """The context made by :func:`init`; a clear error if it was not called."""
    if _context is None or not hvd.is_initialized():
        raise RuntimeError("hvdkit.torch.init() has not been called: call ctx = hvdkit.torch.init() at the top "
                           "of your script")
    return _context


def seed_everything(seed: int, rank: int | None = None) -> int:
    """Seed Python, numpy and torch with ``seed + rank`` so ranks draw different dropout/augmentation.

    Returns the seed used. Pass ``rank=0`` for the same stream on every rank.
    """
    effective = seed + (current().rank if rank is None else rank)
    random.seed(effective)
    np.random.seed(effective % 2**32)
    torch.manual_seed(effective)
    return effective
