"""The usual Horovod callbacks for ``model.fit``, in the order that makes them right.

Example::

    model.fit(x, y, verbose=ctx.verbose,
              callbacks=hk.callbacks(keras.callbacks.ReduceLROnPlateau(),
                                     keras.callbacks.ModelCheckpoint("best.keras"),
                                     warmup_epochs=2))

Order: broadcast rank 0's initial state; metrics over every rank's data (before
anything that reads them, such as ReduceLROnPlateau, TensorBoard or
ModelCheckpoint); warm the learning rate up; then the user's callbacks, with
those that write files (ModelCheckpoint, TensorBoard, CSVLogger, BackupAndRestore)
kept on rank 0 only.
"""

from __future__ import annotations

import inspect
import logging

import numpy as np

from hvdkit.common.errors import UserError
from hvdkit.keras.checkpoint import check_checkpoint_path, save_checkpoint
from hvdkit.keras.collectives import backend_for
from hvdkit.keras.context import current
from hvdkit.keras.metrics import sync_metrics
from hvdkit.keras.mode import keras_module
from hvdkit.keras.nonfinite import nonfinite_loss_callback
from hvdkit.keras.optimizer import (
    broadcast_state,
    check_distributed,
    check_loss_scale_inside,
    get_learning_rate,
    is_distributed,
    set_learning_rate,
)
from hvdkit.keras.stragglers import straggler_report
from hvdkit.keras.xla import split_train_step
from hvdkit.runtime import async_save
from hvdkit.runtime.checkpoint_files import is_directory_target
from hvdkit.runtime.datacheck import rows_fingerprint, same_everywhere
from hvdkit.runtime.lr import warmup_lr
from hvdkit.runtime.lr import warmup_steps as count_warmup_steps
from hvdkit.runtime.optimizer_record import OptimizerRecord, attach, global_batch_of, record_of
from hvdkit.runtime.preemption import PreemptionGuard

log = logging.getLogger("hvdkit.keras")

RANK0_ONLY = ("ModelCheckpoint", "TensorBoard", "CSVLogger", "BackupAndRestore")


def callbacks(*user_callbacks, warmup_epochs: float | None = None, warmup_steps: int | None = None,
              broadcast: bool = True,
              average_metrics: bool = True, root_rank: int = 0, preemption_checkpoint: str | None = None,
              check_finite: bool = True) -> list:
    """The callback list for ``model.fit``: hvdkit's, then ``user_callbacks`` (file writers on rank 0 only).

    Warmup is given in epochs or in steps (batches), as for
    :func:`hvdkit.torch.warmup_scheduler`; fit's steps per epoch turn epochs into steps.

    ``preemption_checkpoint``: a file or a directory (ending in '/'); when any
    rank gets SIGTERM or SIGUSR1, every rank stops at the next batch end, rank 0
    writes a checkpoint there (``epoch`` and ``batch`` in its extra; in a
    directory as ``ckpt-<global step>.npz``) and the processes exit with
    ``hvdkit.runtime.preemption.REQUEUE_EXIT_CODE``. That the path is writable is
    checked when ``fit`` starts, not when the signal comes.

    ``check_finite``: after each batch the ranks compare their losses (one
    small allreduce), and every rank raises ``NonFiniteGradientError`` naming
    the rank whose loss went NaN or inf (:mod:`hvdkit.keras.nonfinite`).
    """
    ctx = current()
    classes = _callback_classes(ctx.mode)
    out = []
    if ctx.mode == "tensorflow":         # XLA's step and Horovod's allreduce apart (hvdkit/keras/xla.py)
        out.append(classes["XlaOutsideCollectives"]())
    if check_finite:       # one small allreduce a batch (hvdkit/keras/nonfinite.py); before the preemption
        out.append(classes["StopOnNonFiniteLoss"]())  # checkpoint, which must not save a NaN batch's weights
    out.append(classes["EpochOrder"]())         # sets hk.distributed_batches' epoch; nothing for other data
    if preemption_checkpoint is not None:
        out.append(classes["PreemptionCheckpoint"](preemption_checkpoint))
    if broadcast:
        out.append(classes["BroadcastInitialState"](root_rank))
    if average_metrics:
        out.append(classes["MetricAverage"]())
    if warmup_steps is not None and warmup_epochs is not None:
        raise UserError("give warmup_steps or warmup_epochs, not both")
    if (warmup_epochs or 0) < 0 or (warmup_steps or 0) < 0:
        raise UserError(f"warmup_epochs={warmup_epochs}, warmup_steps={warmup_steps}: give 0 or more")
    if warmup_epochs or warmup_steps:
        out.append(classes["LearningRateWarmup"](warmup_epochs, warmup_steps))
    out.append(classes["StragglerReport"]())         # one small allgather an epoch (hvdkit/keras/stragglers.py)
    writers = tuple(getattr(keras_module(ctx.mode).callbacks, name) for name in RANK0_ONLY
                    if hasattr(keras_module(ctx.mode).callbacks, name))
    for cb in user_callbacks:
        # Subclasses too: a user's ModelCheckpoint subclass on every rank wrote one file from all of them.
        if ctx.rank != root_rank and (isinstance(cb, writers) or type(cb).__name__ in RANK0_ONLY):
            continue
        out.append(cb)
    # Last: no rank returns from fit before every callback finished on every rank, so a file that rank 0's
    # ModelCheckpoint wrote at the last epoch's end is complete when any rank reads it after fit (rank 1 read
    # it half-written: "BlockingIOError: unable to lock file").
    out.append(classes["TrainEndBarrier"]())
    return out


_CLASSES: dict[str, dict[str, type]] = {}


def _callback_classes(mode: str) -> dict[str, type]:
    """Callback classes subclass the active Keras's Callback, so they are made once Keras is known."""
    if mode not in _CLASSES:
        keras, backend = keras_module(mode), backend_for(mode)
        _CLASSES[mode] = {"BroadcastInitialState": _broadcast_initial_state(keras, backend),
                          "MetricAverage": _metric_average(keras, backend),
                          "LearningRateWarmup": _learning_rate_warmup(keras),
                          "PreemptionCheckpoint": _preemption_checkpoint(keras),
                          "EpochOrder": _epoch_order(keras),
                          "StragglerReport": straggler_report(keras, backend),
                          "StopOnNonFiniteLoss": nonfinite_loss_callback(keras, backend),
                          "TrainEndBarrier": _train_end_barrier(keras, backend),
                          "XlaOutsideCollectives": _xla_outside_collectives(keras)}
    return _CLASSES[mode]


def _broadcast_initial_state(keras, backend) -> type:
    class BroadcastInitialState(keras.callbacks.Callback):
        """Copies rank 0's weights and optimizer state before the first step; checks the optimizer and the data.

        At train begin a plain optimizer (``compile(optimizer="adam")``) on
        several ranks raises, and rank 0 warns if every rank was given the
        same arrays (:func:`check_data_differs`). After the first batch,
        rank 0 warns if every rank computed the same loss (unsharded data
        that fit did not shuffle, e.g. a tf.data pipeline).
        """

        def __init__(self, root_rank: int = 0):
            super().__init__()
            self.root_rank = root_rank
            self.done = False
            self.checked = False

        def on_train_begin(self, logs=None):
            check_distributed(self.model.optimizer)
            if _batches_of(self.model) is not None:     # hk.distributed_batches: sharded by construction
                self.checked = True
            elif current().size > 1:
                self.checked = check_data_differs(backend, self.model, self.root_rank) or self.checked
            if not self.done:
                broadcast_state(self.model, self.model.optimizer, self.root_rank)
                self.done = True

        def on_train_batch_end(self, batch, logs=None):
            if self.checked or batch != 0 or current().size == 1 or not logs or "loss" not in logs:
                return
            self.checked = True
            losses = backend.allgather_object(float(logs["loss"]), name="hvdkit.first_loss")
            if current().rank == self.root_rank and len(set(losses)) == 1:
                log.warning("hvdkit: every rank computed the same loss on its first batch, so the data is probably "
                            "not sharded: call x, y = hk.shard_arrays(x, y) (or ds = hk.shard_dataset(ds)) before "
                            "fit, so each rank trains on its own 1/size of the data")

    return BroadcastInitialState


def check_data_differs(backend, model, root_rank: int = 0) -> bool:
    """At train begin, on every rank: True (and a warning on ``root_rank``) if all ranks hold the same data.

    Every rank sends an order-independent fingerprint of the numpy arrays it
    passed to ``fit`` (x and y, a multiset hash of their rows:
    :func:`hvdkit.runtime.datacheck.rows_fingerprint`), so unsharded data is
    found whether or not the script or fit shuffled it; ranks that shard by
    any means (hk.shard_arrays, slicing by rank, tf.data's own ``shard``)
    differ and are not warned. Data other than numpy arrays (tf.data,
    generators) sends None: no warning.
    """
    x, y = _fit_inputs(model)
    arrays = _leaves(x) + ([y] if isinstance(y, np.ndarray) else [])
    if not same_everywhere(backend, rows_fingerprint(arrays), name="hvdkit.fit_data"):
        return False
    if current().rank == root_rank:
        log.warning("hvdkit: every rank was given the same training data, so each of the %d ranks trains on all of "
                    "it: call x, y = hk.shard_arrays(x, y) (or ds = hk.shard_dataset(ds)) before fit, so each rank "
                    "trains on its own 1/size of the data", current().size)
    return True


def _fit_args(model) -> dict:
    """The arguments ``model.fit`` was called with (its frame's locals); empty where not found.

    Keras gives callbacks no handle on fit's data, but fit's own frame holds
    it, named ``x``, ``y`` and ``shuffle`` in Keras 3's trainers and in
    tf-keras. A Keras that renames them only loses the checks.
    """
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            return frame.f_locals
        frame = frame.f_back
    return {}


def _fit_inputs(model):
    """The ``x`` and ``y`` that ``model.fit`` was called with; None where not found."""
    args = _fit_args(model)
    return args.get("x"), args.get("y")


def _leaves(x) -> list:
    return list(x.values()) if isinstance(x, dict) else list(x) if isinstance(x, (list, tuple)) else [x]


def _xla_outside_collectives(keras) -> type:
    class XlaOutsideCollectives(keras.callbacks.Callback):
        """With XLA on (jit_compile="auto" on a GPU), fit compiles its step up to the gradients; Horovod runs after.

        Keras calls ``set_model`` before it makes the train function, so the
        split function is the one fit runs (:func:`hvdkit.keras.xla.split_train_step`).
        """

        def set_model(self, model):
            super().set_model(model)
            optimizer = getattr(model, "optimizer", None)
            if not is_distributed(optimizer) or getattr(model, "run_eagerly", False) or not model.jit_compile:
                return
            check_loss_scale_inside(optimizer)    # at any size: it would apply inside XLA, within the scale's cond
            split_train_step(model, keras)

    return XlaOutsideCollectives


def _train_end_barrier(keras, backend) -> type:
    class TrainEndBarrier(keras.callbacks.Callback):
        """At the end of fit, after every other callback: wait until every rank is there (one tiny allreduce)."""

        def on_train_end(self, logs=None):
            if current().size > 1:
                backend.allreduce_floats([0.0], "sum", name="hvdkit.train_end")

    return TrainEndBarrier


def _metric_average(keras, backend) -> type:
    class MetricAverage(keras.callbacks.Callback):
        """Each epoch's logged metrics as one process over every rank's data logs them (:mod:`hvdkit.keras.metrics`).

        The model's metric states are summed over the ranks (:func:`sync_metrics`) before the results are taken:
        the training metrics when fit's validation starts (or at the epoch's end without one), the validation
        metrics when it ends. Keras hands callbacks a copy of evaluate's logs, so a plain ``model.evaluate``
        cannot be corrected from here: ``hk.evaluate`` is the exact one. Numbers that are not metric results
        (a callback's own entries) are averaged, as before.
        """

        def on_epoch_begin(self, epoch, logs=None):
            self.training = None                # this epoch's training results, summed over the ranks
            self.validation = {}

        def on_test_begin(self, logs=None):
            if getattr(self, "training", False) is None:     # fit's validation: the training state is still there
                self.training = self._synced_results()

        def on_test_end(self, logs=None):
            if getattr(self, "training", False) is not False:
                self.validation = {f"val_{k}": v for k, v in self._synced_results().items()}

        def on_epoch_end(self, epoch, logs=None):
            if not logs:
                return
            training = self.training if self.training is not None else self._synced_results()
            self.training = False
            logs.update({k: v for k, v in training.items() if k in logs})
            logs.update({k: v for k, v in self.validation.items() if k in logs})
            exact = set(training) | set(self.validation)
            keys = sorted(k for k, v in logs.items() if k not in exact and (isinstance(v, (int, float))
                                                                            or hasattr(v, "__float__")))
            if keys:
                values = backend.allreduce_floats([float(logs[k]) for k in keys], "average",
                                                  name=f"hvdkit.metrics.{epoch}")
                logs.update(zip(keys, values))

        def _synced_results(self) -> dict:
            sync_metrics(*self.model.metrics)
            results = {}
            for metric in self.model.metrics:
                value = metric.result()
                items = value.items() if isinstance(value, dict) else [(metric.name, value)]
                results.update((k, float(v)) for k, v in items)
            return results

    return MetricAverage


def _learning_rate_warmup(keras) -> type:
    class LearningRateWarmup(keras.callbacks.Callback):
        """Per-batch linear warmup from rate/size to the optimizer's (scaled) rate (Goyal et al.)."""

        def __init__(self, warmup_epochs: float | None, warmup_steps: int | None = None):
            super().__init__()
            self.warmup_epochs, self.warmup_steps = warmup_epochs, warmup_steps
            self.target = None
            self.epoch = 0

        def on_train_begin(self, logs=None):
            # An unsized tf.data dataset or a generator: fit learns the epoch's length only at its end.
            if self.warmup_epochs and not self.params.get("steps"):
                raise UserError(f"callbacks(warmup_epochs={self.warmup_epochs}): fit does not know the steps per "
                                 "epoch of this data; give callbacks(warmup_steps=...) instead, or "
                                 "fit(steps_per_epoch=...)")
            optimizer = self.model.optimizer
            if global_batch_of(optimizer) is not None:
                raise UserError("callbacks(warmup_epochs/warmup_steps) ramps up from rate / size, which changes with "
                                "the number of ranks, and a fixed global batch keeps one rate at any size: for a "
                                "warmup of your own give the optimizer a schedule (keras.optimizers.schedules."
                                "CosineDecay(..., warmup_target=lr, warmup_steps=n)), which counts steps")
            schedule = getattr(getattr(optimizer, "inner_optimizer", None) or optimizer, "_learning_rate", None)
            if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
                raise UserError(f"callbacks(warmup_epochs/warmup_steps) sets the learning rate each batch, but the "
                                f"optimizer's rate is a schedule ({type(schedule).__name__}), which Keras does not let "
                                "anyone set: put the warmup in the schedule (e.g. keras.optimizers.schedules."
                                "CosineDecay(..., warmup_target=hk.scale_lr(lr), warmup_steps=n)) and drop the "
                                "callbacks' warmup")
            if self.target is None:
                # A resumed job's optimizer holds the rate its checkpoint saved, mid-warmup a lower one: the
                # checkpoint carries the target (hvdkit.keras.checkpoint), rescaled for this world size.
                self.target = (record_of(optimizer) or OptimizerRecord()).warmup_target or \
                    get_learning_rate(optimizer)
            attach(optimizer, warmup_target=self.target)
            self.data = _batches_of(self.model)
            self.batches = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1

        def on_train_batch_begin(self, batch, logs=None):
            steps = self.params.get("steps")
            if self.data is not None:        # hk.distributed_batches: a resumed epoch's rest has fewer batches
                per_batch = self.data.batch_size * self.data.size
                steps = -(-self.data.epoch_size // per_batch)
                batch += self.data.start_sample // per_batch
            total = count_warmup_steps(self.warmup_steps, self.warmup_epochs, steps)
            # Without the epoch's length (warmup_steps only) the batches of this fit are counted instead.
            step = self.epoch * steps + batch if steps else self.batches
            if step <= total:
                set_learning_rate(self.model.optimizer,
                                  warmup_lr(step, total, self.target / current().size, self.target))

    return LearningRateWarmup


def _batches_of(model):
    """The ``hk.distributed_batches`` that fit is training ``model`` on, or None for other data."""
    x, _ = _fit_inputs(model)
    return x if hasattr(x, "start_sample") and hasattr(x, "position") else None


def _fit_shuffles(model) -> bool:
    """Whether fit was asked to shuffle (its default): for a PyDataset, Keras then shuffles the batches' order."""
    return bool(_fit_args(model).get("shuffle", False))


def _epoch_order(keras) -> type:
    class EpochOrder(keras.callbacks.Callback):
        """Gives ``hk.distributed_batches`` each epoch's number, as ``sampler.set_epoch`` does for torch.

        A pass that starts mid-epoch (``batches.resume``) has fewer batches,
        and Keras gives every epoch of one fit the same number, so such a
        fit must cover that epoch alone: :func:`hvdkit.keras.data.fit` does.
        """

        def on_train_begin(self, logs=None):
            self.data = _batches_of(self.model)
            if self.data is not None and _fit_shuffles(self.model):
                raise UserError("model.fit(batches) shuffles the order of hk.distributed_batches' batches, so a "
                                 "checkpoint could not say which samples were trained on: call hk.fit(model, batches, "
                                 "...) or model.fit(batches, shuffle=False); the batches shuffle their rows themselves")
            if self.data is not None and hasattr(self.data, "seed_slot"):
                if getattr(self.model, "steps_per_execution", 1) != 1:
                    raise UserError(f"compile(steps_per_execution={self.model.steps_per_execution}) runs several "
                                    "batches between callbacks, and a fixed global batch seeds each micro-batch's "
                                    "dropout before it runs: compile with steps_per_execution=1")
                if getattr(self.data, "step_sum", None) is not None:
                    self.data.step_sum.reset()
                synced = [layer.name for layer in self.model._flatten_layers(include_self=False, recursive=True)
                          if "SyncBatchNormalization" in type(layer).__name__]
                if synced:
                    raise UserError(f"layer {synced[0]!r} is a SyncBatchNormalization, which gathers statistics from "
                                    "every rank at each batch, and with a fixed global batch ranks take different "
                                    "micro-batches, so their statistics would mix the ranks' shares: use "
                                    "keras.layers.BatchNormalization (docs/GLOBAL_BATCH.md)")
            if self.data is not None and self.data.start_sample and self.params.get("epochs") != self.data.epoch + 1:
                raise UserError(f"these batches resume epoch {self.data.epoch} at sample {self.data.start_sample}, "
                                 "which Keras cannot fit together with other epochs: call hk.fit(model, batches, "
                                 "epochs=..., callbacks=...) instead of model.fit")

        def on_epoch_begin(self, epoch, logs=None):
            if self.data is None or epoch == self.data.epoch:
                return
            if self.data.start_sample:
                raise UserError(f"these batches resume epoch {self.data.epoch}, but fit began epoch {epoch}: call "
                                 "hk.fit(model, batches, epochs=..., callbacks=...) instead of model.fit")
            self.data.set_epoch(epoch)

        # hk.global_batches: each slot's dropout drawn from its micro-batch's place, and the slots counted for the
        # checkpoint's place in the epoch (hvdkit/keras/global_batch.py).
        def on_train_batch_begin(self, batch, logs=None):
            if self.data is not None and hasattr(self.data, "seed_slot"):
                self.data.seed_slot(self.model, batch)

        def on_train_batch_end(self, batch, logs=None):
            async_save.check()          # a background save (blocking=False) that failed: raised at the batch after
            if self.data is not None and hasattr(self.data, "seed_slot"):
                self.data.unseed_slot()
                self.data.trained = batch + 1

    return EpochOrder


def _preemption_checkpoint(keras) -> type:
    class PreemptionCheckpoint(keras.callbacks.Callback):
        """On a termination signal on any rank: checkpoint at the next batch end on every rank, then exit."""

        def __init__(self, path: str):
            super().__init__()
            self.path = path
            self.epoch = 0
            self.batches_done = 0           # names the file in a directory when fit does not know the steps
            self.stopped_at: tuple[int, int] | None = None
            self.guard = PreemptionGuard()     # one tiny allreduce per batch, as hvdkit.torch's guard

        def on_train_begin(self, logs=None):
            check_checkpoint_path(self.path, self.model, self.model.optimizer)
            self.data = _batches_of(self.model)

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            self.batches_done += 1
            if self.data is not None and not getattr(self.data, "at_step_end", lambda _: True)(batch + 1):
                return                       # hk.global_batches: mid-step, the step's sum is not applied yet
            if self.guard.requested():
                self.stopped_at = (self.epoch, batch + 1)
                where = {}
                if self.data is not None:   # the job's count of samples: resumable on any number of ranks
                    where["samples"] = self.data.position(batch + 1)
                    step = self.epoch * self.data.epoch_size + where["samples"]
                else:                        # this rank's batches: the same number of ranks must resume it
                    steps = self.params.get("steps")
                    step = self.epoch * steps + batch + 1 if steps else self.batches_done
                if is_directory_target(self.path):     # named by the step, so a later preemption sorts newer
                    where["step"] = step
                # Every rank waits for rank 0's write and its outcome before any exits (runtime/preemption.py).
                self.guard.save_and_exit(save_checkpoint, self.path, self.model, self.model.optimizer,
                                         epoch=self.epoch, batch=batch + 1, **where)

    return PreemptionCheckpoint
