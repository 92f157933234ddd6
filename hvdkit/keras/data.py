"""Data sharding for Keras: each rank trains on its own 1/size of the data.

Example::

    x_train, y_train = hk.shard_arrays(x_train, y_train)            # numpy
    ds = hk.shard_dataset(tf.data.Dataset.from_tensor_slices(...))   # tf.data: shard, then shuffle/batch
    model.fit(ds.shuffle(1000).batch(64).repeat(), steps_per_epoch=hk.steps_per_epoch(n, 64))
"""

from __future__ import annotations

import math

from hvdkit.keras.collectives import for_mode
from hvdkit.keras.context import current


def shard_arrays(*arrays):
    """Rows rank, rank+size, ... of each array (the same rows of each, so x and y stay paired)."""
    ctx = current()
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise ValueError(f"arrays have different lengths {sorted(lengths)}: pass x and y of the same samples")
    shards = tuple(a[ctx.rank::ctx.size] for a in arrays)
    return shards if len(shards) > 1 else shards[0]


def shard_dataset(dataset):
    """``dataset.shard(size, rank)``: call it before shuffle/batch so each rank gets distinct samples."""
    ctx = current()
    return dataset.shard(ctx.size, ctx.rank)


def steps_per_epoch(num_samples: int, batch_size: int) -> int:
    """Batches per rank per epoch when ``num_samples`` are split over all ranks."""
    ctx = current()
    return max(1, math.ceil(num_samples / (batch_size * ctx.size)))


def metric_average(value: float, name: str) -> float:
    """The mean of a Python number over all ranks."""
    return for_mode(current().backend).average_floats([float(value)], name=name)[0]
