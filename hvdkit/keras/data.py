"""Data sharding for Keras: each rank trains on its own 1/size of the data.

Example::

    x_train, y_train = hk.shard_arrays(x_train, y_train)            # numpy; the same row count on every rank
    ds = hk.shard_dataset(tf.data.Dataset.from_tensor_slices(...))   # tf.data: shard, then shuffle/batch
    model.fit(ds.shuffle(1000).batch(64).repeat(), steps_per_epoch=hk.steps_per_epoch(n, 64))
"""

from __future__ import annotations

import logging
import math

import numpy as np

from hvdkit.common.errors import UserError
from hvdkit.keras.collectives import backend_for
from hvdkit.keras.context import current
from hvdkit.runtime.datacheck import rows_fingerprint, same_everywhere
from hvdkit.runtime.sharding import check_batch_size, shard_together, take_unpadded

log = logging.getLogger("hvdkit.keras")


def shard_arrays(*arrays, drop_remainder: bool = False, pad: bool = True):
    """Rows rank, rank+size, ... of each array (the same rows of each, so x and y stay paired).

    Every rank gets the same number of rows, so ``model.fit`` runs the same
    number of batches on every rank (uneven shards deadlock at the last
    batch): the rows are padded to a multiple of the number of ranks by
    repeating the first ones, as torch's DistributedSampler does, or with
    ``drop_remainder=True`` the last ``len % size`` rows are left out.

    ``pad=False`` keeps every row exactly once, so the first ``len % size``
    ranks get one row more: for validation and evaluation data, where the
    ranks need not run the same number of batches and a padding row would be
    counted twice in the metrics (``validation_data=hk.shard_arrays(x_val,
    y_val, pad=False)``; ``hk.callbacks()`` then logs one process's numbers).
    """
    ctx = current()
    if not pad:
        if drop_remainder:
            raise UserError("shard_arrays(pad=False, drop_remainder=True): pad=False keeps every row once and "
                            "drop_remainder=True cuts some; give one of them")
        return shard_together(arrays, ctx.rank, ctx.size, take=take_unpadded)
    return shard_together(arrays, ctx.rank, ctx.size, drop_remainder=drop_remainder)


def shard_dataset(dataset, drop_remainder: bool = False):
    """This rank's shard of a ``tf.data.Dataset``: call it before shuffle/batch.

    A dataset of known length is padded (or, with ``drop_remainder=True``,
    cut) to a multiple of the number of ranks first, as in
    :func:`shard_arrays`, so that every rank sees the same number of elements.
    A dataset of unknown length cannot be evened out here: repeat it and pass
    ``steps_per_epoch`` to ``fit`` (see :func:`steps_per_epoch`).
    """
    ctx = current()
    length = int(dataset.cardinality())
    if length > 0 and length % ctx.size:
        if drop_remainder:
            dataset = dataset.take(length - length % ctx.size)
        else:
            dataset = dataset.concatenate(dataset.take(ctx.size - length % ctx.size))
    elif length == -2 and ctx.size > 1:      # tf.data.UNKNOWN_CARDINALITY
        log.warning("shard_dataset: the dataset's length is unknown, so the ranks may get different numbers of "
                    "batches and deadlock at the last one; use .repeat() and fit(steps_per_epoch=hk.steps_per_epoch"
                    "(n, batch_size))")
    return dataset.shard(ctx.size, ctx.rank)


def check_sharded(*batch) -> bool:
    """Collective: True, and one ``hvdkit:`` line on rank 0, when every rank's ``batch`` holds the same rows.

    ``fit`` checks its data itself (``hk.callbacks()``); a custom loop calls
    this once, on every rank, with its first batch (``x, y`` as tensors or
    arrays), so an unsharded ``tf.data`` pipeline is named instead of every
    rank training on the same data. Rows in another order count as the same.
    A pipeline that shuffles unsharded data with another seed on each rank
    gives different first batches and passes: shard before shuffling.
    """
    ctx = current()
    if ctx.size == 1:
        return False
    arrays = [np.asarray(_to_numpy(b)) for b in batch]
    unsharded = same_everywhere(backend_for(ctx.mode), rows_fingerprint(arrays), name="hvdkit.batch_data")
    if unsharded and ctx.rank == 0:
        log.warning("hvdkit: every rank's first batch holds the same rows, so the data is not sharded: call "
                    "ds = hk.shard_dataset(ds) before shuffle and batch (or x, y = hk.shard_arrays(x, y)), so each "
                    "rank trains on its own 1/size of the data")
    return unsharded


def _to_numpy(value):
    """A batch tensor (TensorFlow, torch, Keras) or array as numpy, off the device."""
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return value.numpy() if hasattr(value, "numpy") else value


def steps_per_epoch(num_samples: int, batch_size: int) -> int:
    """Batches per rank per epoch when ``num_samples`` are split over all ranks."""
    check_batch_size(batch_size)
    ctx = current()
    return max(1, math.ceil(num_samples / (batch_size * ctx.size)))


def distributed_batches(x, y=None, batch_size: int = 32, *, shuffle: bool = True, seed: int = 0,
                        drop_remainder: bool = False, **dataset_kwargs):
    """This rank's batches of ``x`` (and ``y``) for ``fit``, shuffled alike on every rank, resumable mid-epoch.

    What :func:`hvdkit.torch.distributed_loader` is for torch: each epoch one
    order of all rows (seed + epoch, the same on every rank), dealt
    ``order[rank::size]`` as DistributedSampler deals it, so that a
    checkpoint can record how many of the epoch's samples the whole job
    trained on (``batches.position(k)``) and a job on another number of
    ranks continues from there: no sample skipped, none twice. Pass it to
    :func:`fit` (or ``model.fit(batches, shuffle=False)``: Keras's shuffle
    would reorder the batches) in place of ``x, y``, with
    :func:`hvdkit.keras.callbacks`, which sets the epoch. ``dataset_kwargs``
    (``workers``, ...) go to Keras's PyDataset.

    Example::

        batches = hk.distributed_batches(x_train, y_train, 64, seed=42)   # the whole arrays, not shard_arrays'
        batches.resume(hk.load_checkpoint(path, model, optimizer, missing_ok=True))  # None: from the start
        hk.fit(model, batches, epochs=12, callbacks=hk.callbacks(preemption_checkpoint="ckpts/"))
    """
    ctx = current()
    return _batches_class(ctx.mode)(x, y, batch_size, shuffle=shuffle, seed=seed, drop_remainder=drop_remainder,
                                       rank=ctx.rank, size=ctx.size, **dataset_kwargs)


_BATCHES: dict[str, type] = {}


def _batches_class(mode: str) -> type:
    """A subclass of the active Keras's PyDataset (tf-keras: Sequence), made once Keras is known."""
    if mode in _BATCHES:
        return _BATCHES[mode]
    import numpy as np

    from hvdkit.keras.mode import keras_module
    from hvdkit.runtime.sharding import resume_indices, samples_done

    utils = keras_module(mode).utils
    base = getattr(utils, "PyDataset", None) or utils.Sequence

    class DistributedBatches(base):
        """See :func:`distributed_batches`. ``epoch`` and ``start_sample`` say where the next pass starts."""

        def __init__(self, x, y, batch_size: int, *, shuffle: bool, seed: int, drop_remainder: bool,
                     rank: int, size: int, **dataset_kwargs):
            if hasattr(utils, "PyDataset") or dataset_kwargs:
                super().__init__(**dataset_kwargs)     # Keras 3's PyDataset; tf-keras's Sequence takes none
            self.x, self.y = x, y
            lengths = {_length(a) for a in ([x] if y is None else [x, y])}
            if len(lengths) != 1:
                raise UserError(f"x and y have different lengths {sorted(lengths)}: pass the same samples")
            check_batch_size(batch_size)
            self.epoch_size = lengths.pop()
            self.batch_size, self.shuffle, self.seed, self.drop_remainder = batch_size, shuffle, seed, drop_remainder
            self.rank, self.size = rank, size
            self.set_epoch(0)

        def set_epoch(self, epoch: int, start_sample: int = 0) -> None:
            """The next pass is ``epoch``'s order from its ``start_sample``-th sample on (all ranks together)."""
            if start_sample < 0:
                raise UserError(f"start_sample must be >= 0, got {start_sample}")
            order = (np.random.default_rng(self.seed + epoch).permutation(self.epoch_size) if self.shuffle
                     else np.arange(self.epoch_size))
            self.epoch, self.start_sample = epoch, start_sample
            self._fetched: set[int] = set()      # batches of this pass handed out (in this process)
            self._rows = np.asarray(resume_indices(order.tolist(), start_sample, self.rank, self.size,
                                                   drop_last=self.drop_remainder), dtype=np.int64)
            if start_sample and not len(self._rows):
                raise UserError(f"epoch {epoch} from sample {start_sample} leaves no batch on {self.size} ranks "
                                 f"(drop_remainder={self.drop_remainder}): start the next epoch instead")

        def resume(self, extra: dict | None) -> None:
            """Continue where a checkpoint's ``extra`` (``epoch`` and ``samples``) says; None: from the start.

            ``samples`` is what the preemption checkpoint of
            :func:`hvdkit.keras.callbacks` records; an epoch that was finished
            resumes at the next one.
            """
            place = checkpoint_place(extra)
            if place is None:
                return
            epoch, samples = place
            rest = self.epoch_size - samples
            if rest <= 0 or (self.drop_remainder and rest < self.size):     # nothing of that epoch left to train
                self.set_epoch(epoch + 1, 0)
            else:
                self.set_epoch(epoch, samples)

        def on_epoch_end(self) -> None:
            """Keras calls this after each epoch's pass, and Keras 3 also after peeking at batch 0 before fit.
            A pass that fetched every batch moves on to the next epoch's order, so that ``model.fit(batches,
            epochs=n)`` draws a new order each epoch without hk.callbacks too (they used to repeat epoch 0's)."""
            if len(self._fetched) >= len(self):
                self.set_epoch(self.epoch + 1)

        def position(self, batches: int) -> int:
            """Samples of the epoch the job has trained on after ``batches`` batches a rank since the pass began."""
            return samples_done(self.start_sample, batches, self.batch_size, self.size, self.epoch_size, len(self))

        def __len__(self) -> int:
            return math.ceil(len(self._rows) / self.batch_size)

        def __getitem__(self, index: int):
            if not 0 <= index < len(self):
                raise IndexError(f"batch {index} of {len(self)}")
            self._fetched.add(index)
            rows = self._rows[index * self.batch_size:(index + 1) * self.batch_size]
            xs = _take(self.x, rows)
            return xs if self.y is None else (xs, _take(self.y, rows))

    _BATCHES[mode] = DistributedBatches
    return DistributedBatches


def checkpoint_place(extra: dict | None) -> tuple[int, int] | None:
    """(epoch, samples of it trained) from a checkpoint's ``extra``, as the preemption checkpoint of
    :func:`hvdkit.keras.callbacks` writes it; None: no checkpoint (start from the beginning)."""
    if not extra:
        return None
    if "samples" not in extra:
        raise UserError(f"the checkpoint's extra {sorted(extra)} has no 'samples': save it with "
                        "hk.callbacks(preemption_checkpoint=...) or samples=batches.position(batch + 1)")
    return int(extra["epoch"]), int(extra["samples"])


def _length(data) -> int:
    """Samples in ``data``: an array's rows, or the first input's of a dict, list or tuple of inputs."""
    if isinstance(data, dict):
        return _length(next(iter(data.values())))
    if isinstance(data, (list, tuple)):
        return _length(data[0])
    return len(data)


def _take(data, rows):
    if isinstance(data, dict):
        return {k: _take(v, rows) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_take(v, rows) for v in data)
    return data.iloc[rows] if hasattr(data, "iloc") else data[rows]


def fit(model, data, *, epochs: int = 1, **fit_kwargs):
    """``model.fit(data, epochs=..., initial_epoch=data.epoch)``; a mid-epoch resume first finishes that epoch.

    Keras gives every epoch of one ``fit`` the same number of batches, so the
    rest of a preempted epoch (fewer batches) runs as a ``fit`` of its own,
    then the later epochs as another, with the same callbacks. ``data`` is a
    :func:`distributed_batches`. Returns the last ``History``, holding every
    epoch's logs (None when ``data`` is already past ``epochs``). Callbacks
    that keep state across epochs (EarlyStopping's patience, CSVLogger without
    ``append=True``) start over at the second fit, as they do in a resumed job.
    :func:`hvdkit.keras.global_batches` resume the same way.
    """
    if not hasattr(data, "start_sample"):
        raise UserError(f"hk.fit takes hk.distributed_batches(...) or hk.global_batches(...), not "
                        f"{type(data).__name__}: call model.fit for other data")
    if "initial_epoch" in fit_kwargs:
        raise UserError("hk.fit starts at data.epoch: call data.resume(extra) or data.set_epoch(epoch) instead of "
                        "passing initial_epoch")
    fit_kwargs["shuffle"] = False          # Keras would shuffle the batches' order; the rows are shuffled already
    history, logs = None, {}
    if data.epoch >= epochs:               # a resumed job that had finished: nothing left to train
        return None
    if data.start_sample:
        started = data.epoch
        history = model.fit(data, epochs=started + 1, initial_epoch=started, **fit_kwargs)
        logs = dict(history.history)
        if data.epoch == started:          # stopped before the pass ended (on_epoch_end moves on after it)
            data.set_epoch(started + 1)
        if getattr(model, "stop_training", False):       # EarlyStopping and the like ended it there
            return history
    if data.epoch < epochs:
        history = model.fit(data, epochs=epochs, initial_epoch=data.epoch, **fit_kwargs)
        for key, values in history.history.items():
            history.history[key] = logs.get(key, []) + list(values)
    return history
