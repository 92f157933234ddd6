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

import numpy as np
from horovod.common.elastic import ObjectState

from hvdkit.common.errors import UserError
from hvdkit.keras.collectives import broadcast_variables, variable_numpy
from hvdkit.keras.context import backend, current
from hvdkit.keras.mode import keras_module
from hvdkit.keras.optimizer import named_variables, set_learning_rate
from hvdkit.keras.sharded import sharded_part
from hvdkit.runtime.elastic import ElasticCommits, run
from hvdkit.runtime.optimizer_record import global_batch_of


class ElasticState(ElasticCommits, ObjectState):
    """Model and optimizer variables plus ``epoch``, ``step``, ``consumed`` and any keyword you add.

    The keywords are :class:`hvdkit.torch.elastic.ElasticState`'s, except the
    data's: here ``seed`` (the shuffle of :meth:`shard`), there ``sampler``
    (the loader's ElasticSampler), because that is where each keeps how far
    the epoch has gone.
    """

    def __init__(self, model, optimizer, *, base_lr: float | None = None, commit_every: int = 1, epoch: int = 0,
                 step: int = 0, seed: int = 0, **kwargs):
        current()
        if not model.built or not model.variables:
            raise UserError("the model has no weights yet: build it (an Input layer, or model.build(shape)) "
                             "before making its ElasticState")
        if optimizer is not None and sharded_part(optimizer) is not None:
            raise UserError("hk.elastic.ElasticState cannot take a sharded Keras optimizer yet (its slices are cut "
                            "for one world size, and fit's compiled step holds them): leave shard_optimizer_state "
                            "off in elastic Keras jobs (hvdkit.torch's elastic jobs take it)")
        if optimizer is not None and global_batch_of(optimizer) is not None:
            raise UserError("hk.elastic.ElasticState cannot take a Keras optimizer with a fixed global batch yet (each "
                            "rank's slots a step are cut for one world size, and fit's compiled step holds them): "
                            "train elastic Keras jobs with a per-rank batch (hvdkit.torch's elastic jobs take a "
                            "global_batch_loader)")
        self._init_commits(commit_every, [base_lr] if base_lr is not None else None)
        self.model, self.optimizer = model, optimizer
        self._seed = seed
        self._shard_len = 0
        self._named = named_variables(model, optimizer)        # builds the optimizer's slots
        b = backend()
        super().__init__(bcast_object=lambda obj: b.broadcast_object(obj, 0, "hvdkit.elastic.state"),
                         get_rank=b.rank, epoch=epoch, step=step, consumed=0, **kwargs)
        self._save_variables()
        self.register_reset_callbacks([self._after_reset])
        self._after_reset()

    # -- what a commit holds -------------------------------------------------------
    def _save_variables(self) -> None:
        self._saved_values = [np.array(variable_numpy(v), copy=True) for _, v in self._named]

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for (_, variable), value in zip(self._named, self._saved_values):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        broadcast_variables(backend(), self._named, root_rank=0)
        super().sync()
        self._save_variables()   # a new worker's fallback is rank 0's state, not its own random init

    def _set_learning_rates(self, rates: list[float]) -> None:
        set_learning_rate(self.optimizer, rates[0])

    # -- what step_done/epoch_done record (hvdkit.runtime.elastic) -------------------
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
            raise UserError(f"epoch {self.epoch} has no samples left ({n} in all, {self.consumed} consumed): "
                             "call state.epoch_done() after each epoch's fit")
        per_rank = -(-len(left) // ctx.size)
        padded = np.resize(left, per_rank * ctx.size)   # np.resize repeats from the start
        mine = padded[ctx.rank::ctx.size]
        self._shard_len = len(mine)
        out = tuple(a[mine] for a in arrays)
        return out if len(out) > 1 else out[0]

    def callback(self, batch_size: int):
        """A Keras callback that calls :meth:`step_done` after every training batch of the last :meth:`shard`."""
        keras = keras_module(current().mode)
        state = self

        class ElasticCommit(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                batches = -(-state._shard_len // batch_size)
                state.step_done(min(batch_size, state._shard_len - batch * batch_size),
                                last_of_epoch=batch == batches - 1)

        return ElasticCommit()


__all__ = ["ElasticState", "run"]
