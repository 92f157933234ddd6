"""Data sharding for Keras: each rank trains on its own 1/size of the data.

Example::

    x_train, y_train = hk.shard_arrays(x_train, y_train)            # numpy; the same row count on every rank
    ds = hk.shard_dataset(tf.data.Dataset.from_tensor_slices(...))   # tf.data: shard, then shuffle/batch
    model.fit(ds.shuffle(1000).batch(64).repeat(), steps_per_epoch=hk.steps_per_epoch(n, 64))
"""

from __future__ import annotations

import logging
import math

from hvdkit.core.sharding import shard_together
from hvdkit.keras.context import current

log = logging.getLogger("hvdkit.keras")


def shard_arrays(*arrays, drop_remainder: bool = False):
    """Rows rank, rank+size, ... of each array (the same rows of each, so x and y stay paired).

    Every rank gets the same number of rows, so ``model.fit`` runs the same
    number of batches on every rank (uneven shards deadlock at the last
    batch): the rows are padded to a multiple of the number of ranks by
    repeating the first ones, as torch's DistributedSampler does, or with
    ``drop_remainder=True`` the last ``len % size`` rows are left out.
    """
    ctx = current()
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


def steps_per_epoch(num_samples: int, batch_size: int) -> int:
    """Batches per rank per epoch when ``num_samples`` are split over all ranks."""
    ctx = current()
    return max(1, math.ceil(num_samples / (batch_size * ctx.size)))
