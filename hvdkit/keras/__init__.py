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

The names load on first use: ``import hvdkit.keras`` (or its pure ``backend``
module) imports neither Keras nor Horovod, since Keras reads its backend once,
at its first import, and a script may still choose it (:func:`use_backend`).
"""

from importlib import import_module

# name -> the module that defines it (the core's where both adapters share it)
_WHERE = {
    "BackendError": "hvdkit.keras.backend", "resolve_backend": "hvdkit.keras.backend",
    "use_backend": "hvdkit.keras.backend",
    "get_logger": "hvdkit.common.console", "progress": "hvdkit.common.console",
    "REQUEUE_EXIT_CODE": "hvdkit.common.launcher", "PreemptionGuard": "hvdkit.runtime.preemption",
    "UserError": "hvdkit.common.errors",
    "metric_average": "hvdkit.runtime.metrics",
    "callbacks": "hvdkit.keras.fit_callbacks",
    "CheckpointError": "hvdkit.keras.checkpoint", "check_checkpoint_path": "hvdkit.keras.checkpoint",
    "load_checkpoint": "hvdkit.keras.checkpoint", "save_checkpoint": "hvdkit.keras.checkpoint",
    "Context": "hvdkit.keras.context", "current": "hvdkit.keras.context", "init": "hvdkit.keras.context",
    "seed_everything": "hvdkit.keras.context",
    "distributed_batches": "hvdkit.keras.data", "check_sharded": "hvdkit.keras.data", "fit": "hvdkit.keras.data",
    "shard_arrays": "hvdkit.keras.data", "shard_dataset": "hvdkit.keras.data", "steps_per_epoch": "hvdkit.keras.data",
    "DistributedOptimizer": "hvdkit.keras.optimizer", "broadcast_state": "hvdkit.keras.optimizer",
    "scale_lr": "hvdkit.keras.optimizer", "sync_metrics": "hvdkit.keras.metrics",
    "evaluate": "hvdkit.keras.metrics",
}


def __getattr__(name: str):
    if name == "elastic":
        return import_module("hvdkit.keras.elastic")
    if name == "SyncBatchNormalization":
        # Subclasses the Keras that the backend selects, so it is made on first use.
        from hvdkit.keras.backend import resolve_backend
        from hvdkit.keras.sync_batch_norm import layer_class

        return layer_class(resolve_backend())
    if name == "hvd":
        # The Horovod module serving this Keras mode (horovod.tensorflow or horovod.torch), as hvdkit.torch.hvd.
        from hvdkit.keras.backend import resolve_backend
        from hvdkit.keras.collectives import backend_for

        return backend_for(resolve_backend()).hvd
    if name in _WHERE:
        value = getattr(import_module(_WHERE[name]), name)
        globals()[name] = value        # bound once; later lookups do not come here
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "BackendError", "CheckpointError", "Context", "DistributedOptimizer", "PreemptionGuard", "REQUEUE_EXIT_CODE",
    "SyncBatchNormalization", "UserError", "broadcast_state", "callbacks", "check_checkpoint_path", "check_sharded",
    "current",
    "distributed_batches", "elastic", "evaluate", "fit",
    "get_logger", "hvd", "init", "load_checkpoint", "metric_average", "progress", "resolve_backend",
    "save_checkpoint", "scale_lr", "seed_everything", "shard_arrays", "shard_dataset", "steps_per_epoch",
    "sync_metrics", "use_backend",
]
