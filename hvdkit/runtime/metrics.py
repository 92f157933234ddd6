"""Metric averaging over ranks, for any framework (through the job's backend).

Example::

    val_loss = hk.metric_average(val_loss, "val_loss")   # the same number on every rank
"""

from __future__ import annotations

from hvdkit.runtime import context


def metric_average(value, name: str) -> float:
    """The mean over all ranks of a Python number (or a one-element tensor); each rank weighs the same.

    For a mean over samples when shards differ in size, sum the totals and
    the counts instead (``hvdkit.torch.evaluate`` does that).
    """
    return context.backend().allreduce_floats([float(value)], "average", name=name)[0]
