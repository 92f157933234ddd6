"""The per-epoch straggler line for ``model.fit``: the optimizer times its allreduce, a callback reports.

``hk.DistributedOptimizer`` (Keras 3) adds up the seconds its grouped allreduce
takes (where a fast rank waits for the slow one): in Python on the torch backend,
with ``tf.timestamp`` inside the traced step on TensorFlow. The ``StragglerReport``
callback that ``hk.callbacks()`` adds times the epoch from the first batch's
end to the last batch's end; at the epoch's end, one small allgather
(:func:`hvdkit.runtime.stragglers.report_epoch`) lets rank 0 name a rank whose
own step (wall time less that wait and less the time this thread waited for
a CPU core) is twice the others' median. tf-keras uses
Horovod's own optimizer, which has no such timer: there the callback does nothing.
"""

from __future__ import annotations

import time

from hvdkit.keras.context import current
from hvdkit.runtime.optimizer_record import OptimizerRecord, record_of
from hvdkit.runtime.stragglers import core_wait_s, report_epoch, watch_for


class AllreduceTimer:
    """Seconds spent in the gradient allreduce since the optimizer was made, for one Keras mode."""

    def __init__(self, mode: str):
        self.mode = mode
        self.python_s = 0.0
        self.python_core_s = 0.0          # of those seconds, this thread's wait for a core (a spinning wait)
        self.variable = None
        if mode == "tensorflow":
            import tensorflow as tf

            with tf.init_scope():                 # made eagerly, outside any traced step
                self.variable = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="hvdkit_allreduce_s")

    def around(self, reduce, grads: list) -> list:
        """``reduce(grads)``, timed."""
        if self.variable is None:
            started, core = time.perf_counter(), core_wait_s()
            out = reduce(grads)
            self.python_s += time.perf_counter() - started
            self.python_core_s += core_wait_s() - core
            return out
        import tensorflow as tf

        with tf.control_dependencies([g for g in grads if g is not None]):
            started = tf.timestamp()          # once the gradients exist
        with tf.control_dependencies([started]):
            grads = [None if g is None else tf.identity(g) for g in grads]
        out = reduce(grads)
        with tf.control_dependencies([g for g in out if g is not None]):
            self.variable.assign_add(tf.timestamp() - started)
        return out

    def seconds(self) -> float:
        return self.python_s if self.variable is None else float(self.variable.numpy())


def straggler_report(keras, backend) -> type:
    class StragglerReport(keras.callbacks.Callback):
        """Once an epoch, rank 0 names a rank whose own step time is twice the others' median."""

        def __init__(self):
            super().__init__()
            self.timer = None
            self.started = self.ended = None
            self.waited_at_start = 0.0
            self.core_at_start = self.core_at_end = self.core_waited_at_start = 0.0
            self.steps = 0

        def on_train_begin(self, logs=None):
            self.timer = (record_of(self.model.optimizer) or OptimizerRecord()).allreduce_timer

        def on_epoch_begin(self, epoch, logs=None):
            self.started, self.steps = None, 0

        def on_train_batch_end(self, batch, logs=None):
            # The clock starts at the first batch's end, as torch's does: that batch holds the step's tracing.
            if self.timer is None:
                return
            if self.started is None:
                self.started, self.waited_at_start = time.perf_counter(), self.timer.seconds()
                self.core_at_start, self.core_waited_at_start = core_wait_s(), self.timer.python_core_s
            else:
                self.steps += 1
                self.ended, self.core_at_end = time.perf_counter(), core_wait_s()

        def on_epoch_end(self, epoch, logs=None):
            if self.timer is None:        # the same on every rank: all skip the collective
                return
            ctx = current()
            busy = 0.0
            if self.started is not None and self.steps:
                waited = self.timer.seconds() - self.waited_at_start
                # This thread's wait for a core (the host's load), less what the allreduce wait already holds.
                core = self.core_at_end - self.core_at_start - (self.timer.python_core_s - self.core_waited_at_start)
                busy = max(0.0, self.ended - self.started - waited - max(0.0, core))
            report_epoch(backend, self.steps, busy, rank=ctx.rank, size=ctx.size,
                         name=f"hvdkit.stragglers.{epoch}", watch=watch_for(ctx))

    return StragglerReport
