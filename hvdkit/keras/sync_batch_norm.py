"""Synchronized BatchNormalization for Keras 3 (TensorFlow and PyTorch backends) and tf-keras.

In training, each rank's batch statistics are replaced by those of the
global batch (every rank's samples together), so N ranks x batch B normalise
exactly as 1 process x batch N*B: the same outputs, moving statistics and
gradients. Outside training it is the plain layer (moving statistics).

``hk.SyncBatchNormalization`` is the class for the Keras mode that
``hk.init()`` serves (resolved on first use, after the backend is chosen).

Example::

    import hvdkit.keras as hk
    ctx = hk.init()
    x = keras.layers.Conv2D(32, 3)(inputs)
    x = hk.SyncBatchNormalization()(x)       # instead of keras.layers.BatchNormalization()

Why not Horovod's own: ``hvd.SyncBatchNormalization`` subclasses
``tf.keras.layers.BatchNormalization`` with ``fused=False``, a keyword Keras 3
rejects, and overrides a ``_moments`` signature Keras 3 no longer has. On
tf-keras (``TF_USE_LEGACY_KERAS=1``) hvdkit hands over to Horovod's layer.
"""

from __future__ import annotations

from functools import lru_cache

from hvdkit.common.errors import UserError
from hvdkit.keras.collectives import allreduce_sum, backend_for
from hvdkit.keras.mode import keras_module


@lru_cache(maxsize=None)
def layer_class(mode: str):
    """The SyncBatchNormalization class for hvdkit's Keras ``mode`` (built once, after Keras is imported)."""
    backend = backend_for(mode)
    if mode == "tf_keras":
        return backend.hvd.SyncBatchNormalization
    keras = keras_module(mode)
    ops = keras.ops

    @keras.saving.register_keras_serializable(package="hvdkit")
    class SyncBatchNormalization(keras.layers.BatchNormalization):
        """``keras.layers.BatchNormalization`` whose training statistics cover the batch of every rank."""

        def __init__(self, **kwargs):
            if kwargs.pop("synchronized", False):
                raise UserError("synchronized=True is tf.distribute's; hvdkit.keras.SyncBatchNormalization "
                                 "always synchronizes across Horovod ranks: drop the argument")
            super().__init__(**kwargs)
            # Its allreduce runs in the forward pass, where hvdkit's XLA step (hvdkit/keras/xla.py) cannot take it
            # out: Keras then compiles no train step with XLA ("auto" resolves to False), as for its own such layers.
            self.supports_jit = False

        def _moments(self, inputs, mask):
            if backend.size() == 1:
                return super()._moments(inputs, mask)
            axes = self._reduction_axes
            if mask is None:
                weighted = inputs
                count = 1
                shape = ops.shape(inputs)
                for a in axes:
                    count = count * shape[a]     # ints, or scalar tensors for dynamic dimensions
                local_count = ops.ones(self.moving_mean.shape, dtype=inputs.dtype) * ops.cast(count, inputs.dtype)
            else:
                weights = ops.cast(ops.broadcast_to(ops.expand_dims(mask, -1), ops.shape(inputs)), inputs.dtype)
                weighted = inputs * weights
                local_count = ops.sum(weights, axes)
            # One allreduce (sum) of per-channel [count, sum x, sum x^2]; Horovod's allreduce is
            # differentiable (its gradient is the allreduce of the incoming gradient), so
            # backward sees the global statistics' dependence on every rank's inputs.
            local = ops.stack([local_count, ops.sum(weighted, axes), ops.sum(weighted * inputs, axes)])
            total = allreduce_sum(backend, local)
            n = total[0]
            mean = total[1] / n
            variance = total[2] / n - ops.square(mean)
            # Clamp roundoff below zero with relu: on the torch backend ops.maximum of two
            # float64 tensors returns float32 (Keras 3.15, torch dtypes not standardized).
            variance = ops.relu(variance)
            return mean, variance

    return SyncBatchNormalization

