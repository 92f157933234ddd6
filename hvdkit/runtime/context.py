"""Steps 1 and 2 for any framework: initialise Horovod, pin this process's device, seed it; written once.

``hvdkit.torch.init()`` and ``hvdkit.keras.init()`` call :func:`init` with
their backend (:mod:`hvdkit.backends`); what they return, and what
:func:`current` gives back later, is the one :class:`Context` of this process.

Example::

    ctx = hvdkit.torch.init(seed=42)      # -> hvdkit.runtime.context.init(TorchBackend(), "torch", ...)
    if ctx.is_main:
        print(f"{ctx.size} processes on {ctx.cross_size} host(s), device {ctx.device}")
"""

from __future__ import annotations

import logging
import numbers
import os
import random
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hvdkit.common.errors import UserError
from hvdkit.common.launcher import check_joined, check_srun_step, spans_one_host
from hvdkit.common.shared_memory import shm_bytes, small_shm_warning
from hvdkit.common.tuning import apply_horovod_defaults, horovod_controller
from hvdkit.runtime import cuda_driver
from hvdkit.runtime.backend import Backend
from hvdkit.runtime.topology import NoGPUError, Topology, cpu_threads_per_rank

log = logging.getLogger("hvdkit.runtime")


@dataclass(frozen=True)
class Context(Topology):
    """Where this process sits in the job (see :class:`hvdkit.runtime.topology.Topology`), its mode and device.

    ``mode`` is the adapter's mode: ``"torch"`` for :mod:`hvdkit.torch`;
    ``"tensorflow"``, ``"torch"`` or ``"tf_keras"`` for :mod:`hvdkit.keras`.
    ``device`` is in the framework's own type: a ``torch.device``, or a
    TensorFlow device string (``"/GPU:0"``, ``"/CPU:0"``).
    """

    mode: str = "torch"
    device: Any = None

    @property
    def backend(self) -> str:
        """Deprecated since 0.1.0's successor: ``mode`` ("backend" also names the Horovod bindings)."""
        warnings.warn("hvdkit: Context.backend is deprecated and will be removed: use Context.mode",
                      FutureWarning, stacklevel=2)
        return self.mode


@dataclass
class _Process:
    backend: Backend
    context: Context
    adapter: str                                   # "hvdkit.torch" or "hvdkit.keras", for messages
    seed_hook: Callable[[int], None] | None
    scales_lr: bool = False                        # the script asked for a scaled rate (the adapters' scale_lr)


_process: _Process | None = None


def init(backend: Backend, mode: str, *, adapter: str, seed: int | None = None, threads: int | None = None,
         seed_hook: Callable[[int], None] | None = None) -> Context:
    """Initialise Horovod through ``backend``, pin this rank's own GPU (or share the CPU), then seed.

    The GPU is the local rank's when every rank of the host sees all its
    GPUs, else the first visible one (a launcher that gives each rank its
    own); the ranks compare the GPUs' UUIDs first and raise
    :class:`hvdkit.runtime.topology.NoGPUError` if two would share one, or if
    the host has GPUs the framework cannot use (an old driver).
    ``threads`` is the intra-op thread count; by default, on the CPU, the
    host's cores are shared among its local ranks (unless OMP_NUM_THREADS is
    set). ``seed_hook`` seeds what the adapter adds (Keras's own seed).
    A job that another launcher (torchrun) started as several one-process
    Horovod jobs raises :class:`hvdkit.common.launcher.LauncherError` (:func:`~hvdkit.common.launcher.check_joined`).
    ``HVDKIT_DEVICE=cpu`` trains on the CPU whatever GPUs the rank sees or
    its Slurm job was given (where Slurm resets ``CUDA_VISIBLE_DEVICES``).
    A GPU rank whose host's ``/dev/shm`` is smaller than NCCL needs (a plain
    ``docker run``'s 64 MiB) warns once per host, naming ``--ipc=host``.
    """
    global _process
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads < 1):
        raise UserError(f"threads={threads!r}: give the intra-op thread count, 1 or more (or leave it unset: the "
                        "host's cores shared among its ranks on the CPU)")
    cpu_chosen = chooses_cpu(os.environ)   # HVDKIT_DEVICE=cpu: the CPU even where GPUs are visible or allocated
    on_gpu = backend.has_gpu() and not cpu_chosen
    mpi_built = bool(backend.hvd.mpi_built())
    # measured (hvdkit.common.tuning); the environment wins
    apply_horovod_defaults(on_gpu=on_gpu, controller=horovod_controller(os.environ, mpi_built),
                           one_host=spans_one_host(os.environ))
    check_srun_step(os.environ, mpi_built=mpi_built)   # srun without PMIx: say the fix
    if not cpu_chosen:                 # GPUs it cannot use, or asked for and missing: say why
        cuda_driver.check_cuda_usable(on_gpu, backend.framework, backend.cuda_build())
    check_nccl(on_gpu, backend)        # GPUs, but a Horovod without NCCL: say which flavour
    backend.hvd.init()
    where = backend.topology()
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0].endswith(".py") else "train.py"
    check_joined(os.environ, where["size"], script)   # torchrun: N one-process jobs; say the launcher to use
    asked = threads
    if threads is None and not on_gpu:
        threads = cpu_threads_per_rank(where["local_size"])
    # Given, or the CPU default (on a GPU only when asked for); before pin's exchange, which starts TensorFlow's
    # runtime. The default is a best effort; a count the caller gave that cannot be set is an error.
    if threads is not None and not backend.set_threads(threads) and asked is not None:
        raise UserError(f"threads={asked} cannot be applied: {backend.framework}'s runtime had already started "
                        f"(an operation ran before {adapter}.init()); call init() before any {backend.framework} "
                        "operation, or leave threads unset")
    # use_gpu=False only by choice: a rank that lost its GPU still joins as blind, so the mixed job stops
    gpu, device = backend.pin(where["rank"], where["local_rank"], where["local_size"], use_gpu=not cpu_chosen)
    _process = _Process(backend, Context(**where, gpu=gpu, mode=mode, device=device), adapter, seed_hook)
    if gpu is not None and where["local_rank"] == 0:   # a GPU job: one line a host, never on the CPU
        warning = small_shm_warning(shm_bytes())
        if warning:
            log.warning(warning)
    if seed is not None:
        seed_everything(seed)
    return _process.context


GPU_WITHOUT_NCCL = "HVDKIT_GPU_WITHOUT_NCCL"
DEVICE = "HVDKIT_DEVICE"


def chooses_cpu(environ: Mapping[str, str]) -> bool:
    """Whether ``HVDKIT_DEVICE=cpu`` asks for the CPU (unset or ``auto``: a GPU where there is one)."""
    value = environ.get(DEVICE, "").strip().lower()
    if value in ("", "auto"):
        return False
    if value == "cpu":
        return True
    raise UserError(f"{DEVICE}={environ[DEVICE]!r} is not a device choice: set it to cpu (train on the CPU even "
                    f"where GPUs are visible) or auto, or unset it")


def check_nccl(on_gpu: bool, backend: Backend, environ: Mapping[str, str] | None = None) -> None:
    """Refuse to pin a GPU for a Horovod built without NCCL, unless ``HVDKIT_GPU_WITHOUT_NCCL=1``.

    Such a Horovod still allreduces CUDA tensors, through host memory over
    MPI or Gloo, many times slower and with no word: the CPU flavour's Horovod
    under a CUDA torch is the usual way to get there.
    """
    environ = os.environ if environ is None else environ
    if not on_gpu or environ.get(GPU_WITHOUT_NCCL) == "1" or backend.hvd.nccl_built():
        return
    flavour = ("the GPU flavour: scripts/install.sh --gpu (.venv-gpu) or the Dockerfile.gpu image"
               if backend.name == "torch" else
               "the TensorFlow GPU flavour: scripts/install.sh --gpu-tf (.venv-gpu-tf) or the Dockerfile.gpu image "
               "built with --build-arg FLAVOUR=tensorflow")
    raise NoGPUError(f"{backend.framework} sees GPU(s) but this Horovod was built without NCCL, so every allreduce "
                     f"would copy the gradients through host memory: use {flavour}; set {GPU_WITHOUT_NCCL}=1 to "
                     f"train this way knowingly, or {DEVICE}=cpu to train on the CPU")


class NotInitialisedError(UserError):
    """hvdkit's API was used before ``init()``."""


def _not_initialised(adapter: str | None) -> NotInitialisedError:
    how = f"ctx = {adapter}.init()" if adapter else "ctx = hvdkit.torch.init() (or hvdkit.keras.init())"
    return NotInitialisedError(f"init() has not been called: call {how} at the top of your script, before building the "
                        "model")


def current(adapter: str | None = None) -> Context:
    """The context made by :func:`init`; a clear error naming ``adapter``'s init if it was not called."""
    if _process is None or not _process.backend.hvd.is_initialized():
        raise _not_initialised(_process.adapter if _process else adapter)
    return _process.context


def backend(adapter: str | None = None) -> Backend:
    """The backend :func:`init` was given; a clear error if it was not called.

    Unlike :func:`current` it does not ask Horovod whether it is running: an
    elastic reset uses it between ``shutdown()`` and ``init()``.
    """
    if _process is None:
        raise _not_initialised(adapter)
    return _process.backend


def note_scaled_lr() -> None:
    """The script asked for a scaled rate: from now on its checkpoints record the scale, and a resume undoes it."""
    if _process is not None:
        _process.scales_lr = True


def scales_lr() -> bool:
    """Whether this process's script asked for a scaled rate (see :func:`note_scaled_lr`)."""
    return _process is not None and _process.scales_lr


def refresh() -> Context:
    """Re-read rank and size after Horovod re-initialised (an elastic reset); mode and device stay."""
    if _process is None:
        raise _not_initialised(None)
    _process.context = replace(_process.context, **_process.backend.topology())
    return _process.context


def seed_everything(seed: int, *, per_rank: bool = False) -> int:
    """Seed Python, numpy and the framework (and Keras) with ``seed``, the same on every rank; returns it.

    The same seed everywhere, as Accelerate's ``set_seed`` and Lightning's
    ``seed_everything`` do by default: a script that shuffles, permutes or
    ``random_split``s its data before sharding it then does so identically on
    every rank, so the shards are disjoint and cover the data. With per-rank
    seeds (what ``init(seed)`` did before) each rank permuted differently and
    the shards overlapped: 189 of 800 rows on both ranks of a 2-rank Keras
    job, 189 on neither. Dropout masks and augmentations stay different per
    sample, since every rank draws them for different samples.
    ``per_rank=True`` seeds with ``seed + rank``, for randomness that must
    differ between ranks (draw it after sharding).
    """
    ctx = current()
    effective = seed + ctx.rank if per_rank else seed
    random.seed(effective)
    np.random.seed(effective % 2**32)
    _process.backend.seed(effective)
    if _process.seed_hook is not None:
        _process.seed_hook(effective)
    return effective
