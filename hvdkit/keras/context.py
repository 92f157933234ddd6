"""Steps 1 and 2 for Keras: initialise Horovod for the backend and pin the device (the core does it).

Example::

    import hvdkit.keras as hk
    ctx = hk.init(seed=42)          # before building the model
    model.fit(..., verbose=ctx.verbose)      # 2 (a line per epoch) on rank 0, 0 elsewhere
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

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
    As ``keras.utils.set_random_seed``, it seeds TensorFlow too, for
    ``tf.data``'s shuffles; on the torch backend when the script imports it,
    so that a Keras-on-torch rank does not import TensorFlow to start.
    """
    mode = resolve_backend()
    ctx = context.init(backend_for(mode), mode, adapter=ADAPTER, seed=seed, threads=threads,
                       seed_hook=lambda value: _set_keras_seed(mode, value))
    if mode == "torch" and ctx.gpu is None:
        # Keras on torch puts variables on "cuda" whenever torch sees a GPU: HVDKIT_DEVICE=cpu must reach it.
        from keras.src.backend.common import global_state

        global_state.set_global_attribute("torch_device", "cpu")
    return ctx


def _set_keras_seed(mode: str, seed: int) -> None:
    """``keras.utils.set_random_seed(seed)``, without importing TensorFlow on the torch backend.

    Keras seeds TensorFlow wherever it is installed, for the shuffles of ``tf.data`` pipelines, and so imported
    it on every Keras-on-torch rank: 2.0 of a rank's 4.7 s of CPU to start and fit a small model here. On the
    torch backend TensorFlow is seeded now if the script imported it, else when it is imported.
    """
    keras = keras_module(mode)
    if mode != "torch" or "tensorflow" in sys.modules:
        keras.utils.set_random_seed(seed)
        return
    from keras.src.utils import rng_utils

    lazy = getattr(rng_utils, "tf", None)
    if getattr(lazy, "_available", "missing") is not None:   # not Keras 3's unresolved LazyModule: as Keras does
        keras.utils.set_random_seed(seed)
        return
    lazy._available = False            # Keras's own seeding, less TensorFlow's (it is not imported)
    try:
        keras.utils.set_random_seed(seed)
    finally:
        lazy._available = None
    for finder in [f for f in sys.meta_path if isinstance(f, _SeedTensorFlowWhenImported)]:
        sys.meta_path.remove(finder)                   # a later init's seed replaces an earlier one's
    if importlib.util.find_spec("tensorflow") is not None:
        sys.meta_path.insert(0, _SeedTensorFlowWhenImported(seed))


class _SeedTensorFlowWhenImported(importlib.abc.MetaPathFinder):
    """Seeds TensorFlow's global generator once the module ``tensorflow`` has been imported.

    A lookup alone (``importlib.util.find_spec``, as torch's compiler does for its trace rules) seeds nothing
    and keeps the finder; the import that executes the module seeds it and removes the finder.
    """

    def __init__(self, seed: int):
        self.seed, self._looking = seed, False

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow" or self._looking:
            return None
        self._looking = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._looking = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _SeedingLoader(spec.loader, self)
        return spec


class _SeedingLoader(importlib.abc.Loader):
    def __init__(self, loader, finder: _SeedTensorFlowWhenImported):
        self._loader, self._finder = loader, finder

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        module.random.set_seed(self._finder.seed)

    def __getattr__(self, name):          # get_resource_reader and the rest: the real loader's
        if name.startswith("__") or name in ("_loader", "_finder"):   # a copy made without __init__
            raise AttributeError(name)
        return getattr(self._loader, name)


def current() -> Context:
    """The context made by :func:`init`; a clear error if it was not called."""
    return context.current(ADAPTER)


def backend():
    """The :class:`hvdkit.runtime.backend.Backend` serving this job's Keras mode."""
    return context.backend(ADAPTER)


__all__ = ["ADAPTER", "Context", "backend", "current", "init", "refresh", "seed_everything"]
