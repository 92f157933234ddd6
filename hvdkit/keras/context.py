"""Steps 1 and 2 for Keras: initialise Horovod for the backend and pin the device (the core does it).

Example::

    import hvdkit.keras as hk
    ctx = hk.init(seed=42)          # before building the model
    model.fit(..., verbose=ctx.verbose)      # 2 (a line per epoch) on rank 0, 0 elsewhere
"""

from __future__ import annotations

from hvdkit.keras.collectives import backend_for
from hvdkit.keras.mode import keras_module, resolve_backend
from hvdkit.runtime import context
from hvdkit.runtime.context import Context, refresh, seed_everything

ADAPTER = "hvdkit.keras"


def init(seed: int | None = None, threads: int | None = None) -> Context:
    """Initialise Horovod for the active Keras backend, pin this rank's own GPU (or share the CPU).

    What it does is :func:`hvdkit.runtime.context.init`'s, as for
    :func:`hvdkit.torch.init`, through the backend that serves the Keras mode
    (``ctx.mode``: ``"tensorflow"``, ``"torch"`` or ``"tf_keras"``).
    ``ctx.device`` is a ``torch.device`` on the torch backend, a TensorFlow
    device string (``"/GPU:0"``, ``"/CPU:0"``) otherwise.

    Raises :class:`hvdkit.keras.BackendError` for backends Horovod cannot
    serve (JAX, NumPy, OpenVINO). ``seed`` seeds Python, numpy, the framework
    and Keras with ``seed`` on every rank, so a ``np.random.permutation``
    before ``shard_arrays`` agrees across ranks and the shards are disjoint
    (:func:`seed_everything`; ``per_rank=True`` there for per-rank streams).
    """
    mode = resolve_backend()
    ctx = context.init(backend_for(mode), mode, adapter=ADAPTER, seed=seed, threads=threads,
                       seed_hook=lambda value: keras_module(mode).utils.set_random_seed(value))
    if mode == "torch" and ctx.gpu is None:
        # Keras on torch puts variables on "cuda" whenever torch sees a GPU: HVDKIT_DEVICE=cpu must reach it.
        from keras.src.backend.common import global_state

        global_state.set_global_attribute("torch_device", "cpu")
    return ctx


def current() -> Context:
    """The context made by :func:`init`; a clear error if it was not called."""
    return context.current(ADAPTER)


def backend():
    """The :class:`hvdkit.runtime.backend.Backend` serving this job's Keras mode."""
    return context.backend(ADAPTER)


__all__ = ["ADAPTER", "Context", "backend", "current", "init", "refresh", "seed_everything"]
