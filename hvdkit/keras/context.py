"""Steps 1 and 2 for Keras: initialise Horovod for the backend and pin the device.

Example::

    import hvdkit.keras as hk
    ctx = hk.init(seed=42)          # before building the model
    model.fit(..., verbose=ctx.verbose)      # 2 (a line per epoch) on rank 0, 0 elsewhere
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hvdkit.core import cuda_driver, slurm
from hvdkit.core.topology import GPUView, Topology, cpu_threads_per_rank, pin_gpu
from hvdkit.core.tuning import apply_horovod_defaults
from hvdkit.keras.backend import keras_module, resolve_backend
from hvdkit.keras.collectives import for_mode


@dataclass(frozen=True)
class Context(Topology):
    """Where this process sits in the job, the hvdkit Keras mode and the device it uses.

    ``device`` is in the backend's own type: a ``torch.device`` on the torch
    backend (as in :mod:`hvdkit.torch`), a TensorFlow device string
    (``"/GPU:0"``, ``"/CPU:0"``) otherwise; ``gpu`` is the pinned GPU's index
    (None on CPU) on every backend.
    """

    backend: str = "tensorflow"
    device: object = "/CPU:0"


_context: Context | None = None


def init(seed: int | None = None, threads: int | None = None) -> Context:
    """Initialise Horovod for the active Keras backend, pin this rank's own GPU (or share the CPU).

    The GPU is chosen as in :func:`hvdkit.torch.init`: the local rank's when
    every rank of the host sees all its GPUs, else the first visible one, after
    the ranks compared UUIDs (:func:`hvdkit.core.topology.check_gpu_choice`).

    Raises :class:`hvdkit.keras.BackendError` for backends Horovod cannot
    serve (JAX, NumPy, OpenVINO). ``seed`` seeds Keras, numpy and Python with
    ``seed + rank``; weights still start identical because the broadcast
    callback copies rank 0's.
    """
    global _context
    mode = resolve_backend()
    coll = for_mode(mode)
    on_gpu = _has_gpu(mode)
    apply_horovod_defaults(on_gpu=on_gpu)  # measured (hvdkit.core.tuning); the environment wins
    slurm.check_direct_launch(os.environ, mpi_built=bool(coll.hvd.mpi_built()))   # srun without PMIx: say the fix
    cuda_driver.check_cuda_usable(on_gpu, _FRAMEWORK[mode], _cuda_build(mode))   # GPUs it cannot use: say why
    coll.hvd.init()
    local_rank, local_size = coll.hvd.local_rank(), coll.hvd.local_size()
    threads = threads if threads is not None else cpu_threads_per_rank(local_size)
    pin = _pin_torch if mode == "torch" else _pin_tensorflow
    gpu, device = pin(coll, local_rank, local_size, threads)
    _context = Context(
        rank=coll.hvd.rank(), size=coll.hvd.size(), local_rank=local_rank, local_size=local_size,
        cross_rank=coll.hvd.cross_rank(), cross_size=coll.hvd.cross_size(), gpu=gpu, backend=mode, device=device,
    )
    if seed is not None:
        seed_everything(seed, rank=_context.rank)
    return _context


def seed_everything(seed: int, rank: int | None = None) -> int:
    """Seed Keras, numpy and Python (and the backend) with ``seed + rank``; returns the seed used.

    As in :func:`hvdkit.torch.seed_everything`: ranks draw different dropout
    and shuffles; pass ``rank=0`` for the same stream on every rank.
    """
    ctx = current()
    effective = seed + (ctx.rank if rank is None else rank)
    keras_module(ctx.backend).utils.set_random_seed(effective)
    return effective


def _has_gpu(mode: str) -> bool:
    if mode == "torch":
        import torch

        return torch.cuda.is_available()
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


_FRAMEWORK = {"torch": "torch", "tensorflow": "TensorFlow", "tf_keras": "TensorFlow"}


def _cuda_build(mode: str) -> str | None:
    """The CUDA version the backend was built for; None for a CPU-only build."""
    if mode == "torch":
        import torch

        return torch.version.cuda
    import tensorflow as tf

    info = tf.sysconfig.get_build_info()
    return info.get("cuda_version") if info.get("is_cuda_build") else None


def _pin_tensorflow(coll, local_rank: int, local_size: int, threads: int | None) -> tuple[int | None, str]:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        view = GPUView.here(coll.hvd.rank(), local_rank, local_size, _tensorflow_gpu_uuids(len(gpus)))

        def pin(index: int) -> None:
            tf.config.experimental.set_memory_growth(gpus[index], True)
            tf.config.set_visible_devices(gpus[index], "GPU")

        def gather(obj):
            # On the CPU: NCCL would stop at two ranks on one GPU before the check could name them.
            with tf.device("/CPU:0"):
                return coll.allgather_object(obj, name="hvdkit.gpus")

        # Pin first: Horovod's TensorFlow collectives start TensorFlow's runtime, which fixes the visible GPUs.
        gpu = pin_gpu(view, gather, pin, pin_first=True)
        return gpu, "/GPU:0"   # the only GPU TensorFlow now sees
    if threads is not None and tf.config.threading.get_intra_op_parallelism_threads() != threads:
        # Settable only before TensorFlow's runtime starts; the caller may already have used TF.
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
        except RuntimeError:
            pass
    return None, "/CPU:0"


def _tensorflow_gpu_uuids(count: int) -> list[str | None]:
    """The UUIDs of TensorFlow's ``GPU:0..count-1``, from the CUDA driver library (TensorFlow has no UUID API).

    None for each where the library cannot say or counts differently from
    TensorFlow; :attr:`hvdkit.core.topology.GPUView.gpus` then falls back to
    the CUDA_VISIBLE_DEVICES entries.
    """
    uuids = cuda_driver.visible_gpu_uuids()
    return uuids if uuids is not None and len(uuids) == count else [None] * count


def _pin_torch(coll, local_rank: int, local_size: int, threads: int | None):
    import torch

    if torch.cuda.is_available():
        uuids = cuda_driver.torch_gpu_uuids(torch)
        view = GPUView.here(coll.hvd.rank(), local_rank, local_size, uuids)
        gpu = pin_gpu(view, lambda v: coll.allgather_object(v, name="hvdkit.gpus"), torch.cuda.set_device)
        return gpu, torch.device("cuda", gpu)
    if threads is not None:
        torch.set_num_threads(threads)
    return None, torch.device("cpu")


def refresh() -> Context:
    """Re-read rank and size after Horovod re-initialised (an elastic reset); backend and device stay."""
    global _context
    ctx = current()
    hvd = for_mode(ctx.backend).hvd
    _context = Context(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
                       cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(), gpu=ctx.gpu, backend=ctx.backend,
                       device=ctx.device)
    return _context


def current() -> Context:
    """The context made by :func:`init`; a clear error if it was not called."""
    if _context is None or not for_mode(_context.backend).hvd.is_initialized():
        raise RuntimeError("hvdkit.keras.init() has not been called: call ctx = hvdkit.keras.init() before "
                           "building the model")
    return _context
