"""hvdkit.keras: Horovod's six steps for Keras 3 (TensorFlow or PyTorch backend) and tf-keras.

    import hvdkit.keras as hk
    ctx = hk.init(seed=42)                                        # 1, 2
    x, y = hk.shard_arrays(x, y)
    model = build_model()
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(hk.scale_lr(0.01)))   # 3, 5
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, verbose=ctx.verbose, callbacks=hk.callbacks(warmup_epochs=2))   # 4, warmup, metrics
    hk.save_checkpoint("ckpt.npz", model, opt, epoch=1)          # 6 (every rank calls; rank 0 writes)

Choose the backend with KERAS_BACKEND=tensorflow|torch, or TF_USE_LEGACY_KERAS=1
for tf-keras, before importing keras. Launch with ``horovodrun -np 2 python train.py``.
The same names as :mod:`hvdkit.torch` where both have the thing; docs/API.md lists both.

The names load on first use: ``import hvdkit.keras`` (or its pure ``mode``
module) imports neither Keras nor Horovod, since Keras reads its backend once,
at its first import, and a script may still choose it (:func:`use_backend`).
"""

from importlib import import_module

# The module that defines each public name (the core's, where both adapters share it).
_HOME = {
    "hvdkit.common.console": ("get_logger", "progress"),
    "hvdkit.common.errors": ("UserError",),
    "hvdkit.common.launcher": ("REQUEUE_EXIT_CODE",),
    "hvdkit.runtime.metrics": ("metric_average",),
    "hvdkit.runtime.nonfinite": ("NonFiniteGradientError",),
    "hvdkit.runtime.preemption": ("PreemptionGuard",),
    "hvdkit.runtime.async_save": ("wait_for_checkpoint",),
    "hvdkit.runtime.topology": ("NoGPUError",),
    "hvdkit.keras.mode": ("BackendError", "resolve_backend", "use_backend"),
    "hvdkit.keras.checkpoint": ("CheckpointError", "check_checkpoint_path", "load_checkpoint", "save_checkpoint"),
    "hvdkit.keras.context": ("Context", "current", "init", "seed_everything"),
    "hvdkit.keras.data": ("check_sharded", "distributed_batches", "fit", "shard_arrays", "shard_dataset",
                          "steps_per_epoch"),
    "hvdkit.keras.fit_callbacks": ("callbacks",),
    "hvdkit.keras.global_batch": ("global_batches",),
    "hvdkit.keras.metrics": ("evaluate", "sync_metrics"),
    "hvdkit.keras.optimizer": ("DistributedOptimizer", "broadcast_state", "scale_lr"),
}
# Made on first use rather than looked up: they depend on the Keras mode (see __getattr__).
_MADE = ("SyncBatchNormalization", "elastic", "hvd")

__all__ = sorted([name for names in _HOME.values() for name in names] + list(_MADE))


def __getattr__(name: str):
    if name == "elastic":
        return import_module("hvdkit.keras.elastic")
    if name == "SyncBatchNormalization":
        # Subclasses the Keras that the backend selects, so it is made on first use.
        from hvdkit.keras.mode import resolve_backend
        from hvdkit.keras.sync_batch_norm import layer_class

        return layer_class(resolve_backend())
    if name == "hvd":
        # The Horovod module serving this Keras mode (horovod.tensorflow or horovod.torch), as hvdkit.torch.hvd.
        from hvdkit.keras.collectives import backend_for
        from hvdkit.keras.mode import resolve_backend

        return backend_for(resolve_backend()).hvd
    for module, names in _HOME.items():
        if name in names:
            value = getattr(import_module(module), name)
            globals()[name] = value        # bound once; later lookups do not come here
            return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__        # the public names only, not this module's helpers or its loaded submodules
