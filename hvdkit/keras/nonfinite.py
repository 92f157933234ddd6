"""The Keras side of :mod:`hvdkit.runtime.nonfinite`: every rank stops at the batch where a rank's loss went NaN.

``fit`` gives callbacks no gradients, so after each batch the ranks add up a
one-hot vector of "my loss is not finite" (one allreduce of ``size`` floats):
all of them learn which ranks it was at once, and all raise
:class:`hvdkit.runtime.nonfinite.NonFiniteGradientError` together, naming them.
Keras's own ``TerminateOnNaN`` stops only the rank that sees the NaN, leaving
the others waiting in the next allreduce. Part of :func:`hvdkit.keras.callbacks`
(``check_finite=True``, the default; its cost is in docs/RELIABILITY.md).
"""

from __future__ import annotations

import math

from hvdkit.keras.context import current
from hvdkit.runtime.nonfinite import NonFiniteGradientError, nonfinite_loss_message


def nonfinite_loss_callback(keras, backend) -> type:
    class StopOnNonFiniteLoss(keras.callbacks.Callback):
        """After each batch: raise on every rank if any rank's batch loss is NaN or inf."""

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_begin(self, logs=None):
            self.epoch = 0

        def on_train_batch_end(self, batch, logs=None):
            ctx = current()
            if ctx.size == 1 or not logs or "loss" not in logs:
                return
            flags = [0.0] * ctx.size
            flags[ctx.rank] = 0.0 if math.isfinite(float(logs["loss"])) else 1.0
            total = backend.allreduce_floats(flags, "sum", name="hvdkit.nonfinite_loss")
            bad = [rank for rank, flag in enumerate(total) if flag > 0]
            if bad:
                raise NonFiniteGradientError(nonfinite_loss_message(bad, epoch=self.epoch, batch=batch))

    return StopOnNonFiniteLoss
