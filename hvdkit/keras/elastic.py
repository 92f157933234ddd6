"""Elastic training for Keras (3 on TensorFlow or PyTorch, and tf-keras): the same ideas as hvdkit.torch.elastic.

    state = hk.elastic.ElasticState(model, optimizer, base_lr=0.01)

    @hk.elastic.run
    def train(state):
        while state.epoch < epochs:
            xs, ys = state.shard(x_train, y_train)           # what is left of this epoch, this rank's part
            model.fit(xs, ys, batch_size=32, epochs=1, verbose=hk.current().verbose,
                      callbacks=[state.callback(batch_size=32)])   # counts and commits every batch
            state.epoch_done()

A commit holds the model's and the optimizer's variables, the epoch, the
step and how many of this epoch's samples the job has consumed. After a
reset (a lost worker, hosts added or removed) every worker goes back to the
last commit, rank 0's state is broadcast, and ``shard`` splits the rest of
the epoch over the new world size; the learning rate becomes
``base_lr x size``.
"""

from __future__ import annotations

import functools

import numpy as np

from hvdkit.core.elastic import ElasticCommits
from hvdkit.core.lr import scale_lr_for
from hvdkit.keras.backend import keras_module
from hvdkit.keras.checkpoint import _numpy
from hvdkit.keras.collectives import for_mode, import_horovod
from hvdkit.keras.context import current, refresh
from hvdkit.keras.optimizer import ensure_built, optimizer_variables, set_learning_rate

_elastic = import_horovod("horovod.common.elastic")
HorovodInternalError = import_horovod("horovod.common.exceptions").HorovodInternalError


def run(func):
    """``@hk.elastic.run``: restore, re-sync and retry ``func(state)`` whenever the job changes.

    Horovod's TensorFlow decorator only recognises failures of its plain
    allreduce/allgather/broadcast ops; hvdkit's optimizer uses grouped
    allreduce, so any TensorFlow error raised by a Horovod op counts here.
    """
    mode = current().backend
    hvd = for_mode(mode).hvd

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - re-raised unless it is a Horovod collective failure
            if mode != "torch" and type(exc).__module__.startswith("tensorflow") and "Horovod" in str(exc):
                raise HorovodInternalError(exc) from exc
            raise

    def reset():
        hvd.shutdown()
        hvd.init()

    return _elastic.run_fn(wrapper, reset)


class ElasticState(ElasticCommits, _elastic.ObjectState):
    """Model and optimizer variables plus ``epoch``, ``step``, ``consumed`` and any keyword you add."""

    def __init__(self, model, optimizer, *, base_lr: float | None = None, commit_every: int = 1, seed: int = 0,
                 epoch: int = 0, step: int = 0, **kwargs):
        self._init_commits(commit_every)
        if not model.built or not model.variables:
            raise ValueError("the model has no weights yet: build it (an Input layer, or model.build(shape)) "
                             "before making its ElasticState")
        self.model, self.optimizer = model, optimizer
        self._coll = for_mode(current().backend)
        self._base_lr, self._seed = base_lr, seed
        self._shard_len = 0
        ensure_built(model, optimizer)
        super().__init__(bcast_object=lambda obj: self._coll.broadcast_object(obj, 0, "hvdkit.elastic.state"),
                         get_rank=self._coll.hvd.rank, epoch=epoch, step=step, consumed=0, **kwargs)
        self._save_variables()
        self.register_reset_callbacks([self._after_reset])
        self._after_reset()

    # -- what a commit holds -------------------------------------------------------
    def _variables(self) -> list:
        return list(self.model.variables) + optimizer_variables(self.optimizer)

    def _save_variables(self) -> None:
        self._saved_values = [np.array(_numpy(v), copy=True) for v in self._variables()]

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self._variables(), self._saved_values):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        self._coll.broadcast_variables(self._variables(), root_rank=0)
        super().sync()
        self._save_variables()   # a new worker's fallback is rank 0's state, not its own random init

    def _after_reset(self) -> None:
        ctx = refresh()
        if self._base_lr is not None:
            set_learning_rate(self.optimizer, scale_lr_for(self._base_lr, ctx))

    # -- what step_done/epoch_done record (hvdkit.core.elastic) -------------------
    def _consume(self, samples: int) -> None:
        self.consumed += samples * current().size

    def _start_epoch(self) -> None:
        self.consumed = 0

    # -- data ----------------------------------------------------------------------
    def shard(self, *arrays):
        """This rank's part of the samples the current epoch has not consumed yet (shuffled by seed + epoch).

        As Horovod's ElasticSampler does for PyTorch, every rank gets
        ceil(left / size) samples, the last few repeated from the start of
        what is left, so every rank runs the same number of steps and a job
        that grew past the samples left still takes one step.
        """
        ctx = current()
        n = len(arrays[0])
        left = np.random.RandomState(self._seed + self.epoch).permutation(n)[self.consumed:]
        if not len(left):
            raise ValueError(f"epoch {self.epoch} has no samples left ({n} in all, {self.consumed} consumed): "
                             "call state.epoch_done() after each epoch's fit")
        per_rank = -(-len(left) // ctx.size)
        padded = np.resize(left, per_rank * ctx.size)   # np.resize repeats from the start
        mine = padded[ctx.rank::ctx.size]
        self._shard_len = len(mine)
        out = tuple(a[mine] for a in arrays)
        return out if len(out) > 1 else out[0]

    def callback(self, batch_size: int):
        """A Keras callback that calls :meth:`step_done` after every training batch of the last :meth:`shard`."""
        keras = keras_module(current().backend)
        state = self

        class ElasticCommit(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                batches = -(-state._shard_len // batch_size)
                state.step_done(min(batch_size, state._shard_len - batch * batch_size),
                                last_of_epoch=batch == batches - 1)

        return ElasticCommit()
