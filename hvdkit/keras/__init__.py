"""hvdkit.keras: Horovod's six steps for Keras 3 (TensorFlow or PyTorch backend) and tf-keras.

    import hvdkit.keras as hk
    ctx = hk.init(seed=42)                                        # 1, 2
    x, y = hk.shard_arrays(x, y)
    model = build_model()
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(hk.scale_lr(0.01)))   # 3, 5
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, verbose=ctx.verbose, callbacks=hk.callbacks(warmup_epochs=2))   # 4, warmup, metrics
    hk.save_checkpoint("ckpt.npz", model, opt, epoch=1)          # 6 (rank 0 only)

Choose the backend with KERAS_BACKEND=tensorflow|torch, or TF_USE_LEGACY_KERAS=1
for tf-keras, before importing keras. Launch with ``horovodrun -np 2 python train.py``.
The same names as :mod:`hvdkit.torch` where both have the thing; docs/API.md lists both.
"""

from hvdkit.core.console import get_logger, progress
from hvdkit.core.preemption import REQUEUE_EXIT_CODE
from hvdkit.keras import elastic
from hvdkit.keras.backend import BackendError, resolve_backend, use_backend
from hvdkit.keras.callbacks import callbacks
from hvdkit.keras.checkpoint import CheckpointError, check_checkpoint_path, load_checkpoint, save_checkpoint
from hvdkit.keras.context import Context, current, init, seed_everything
from hvdkit.keras.data import metric_average, shard_arrays, shard_dataset, steps_per_epoch
from hvdkit.keras.optimizer import DistributedOptimizer, broadcast_state, scale_lr


def __getattr__(name: str):
    # SyncBatchNormalization subclasses the Keras that the backend selects, so it
    # is made on first use rather than at import (which must not import Keras).
    if name == "SyncBatchNormalization":
        from hvdkit.keras.sync_batch_norm import layer_class

        return layer_class(resolve_backend())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BackendError", "CheckpointError", "Context", "DistributedOptimizer", "REQUEUE_EXIT_CODE",
    "SyncBatchNormalization",
    "broadcast_state", "callbacks", "check_checkpoint_path", "current", "elastic", "get_logger", "init",
    "load_checkpoint",
    "metric_average", "progress", "resolve_backend", "save_checkpoint", "scale_lr", "seed_everything",
    "shard_arrays", "shard_dataset", "steps_per_epoch", "use_backend",
]
