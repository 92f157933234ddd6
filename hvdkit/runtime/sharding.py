"""Which rows each rank trains on: every rank gets the same number, so every rank runs the same steps.

Ranks that run different numbers of steps deadlock: the rank with one more
batch waits in an allreduce the others never join. ``torch``'s
DistributedSampler avoids it by padding; :func:`shard_indices` does the same
for arrays, and both adapters' ``shard_arrays`` use it.

Example::

    shard_indices(10, rank=2, size=4)                       # [2, 6, 0]: 10 rows padded to 12 with rows 0, 1
    shard_indices(10, rank=2, size=4, drop_remainder=True)  # [2, 6]: rows 8 and 9 are left out
    take_shard(x, rank=2, size=4)                           # x[2::4] plus x[[0]]: a view, then the padding
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from hvdkit.common.errors import UserError
from hvdkit.runtime import topology


def shard_indices(length: int, rank: int, size: int, *, drop_remainder: bool = False) -> list[int]:
    """Row indices ``rank, rank + size, ...`` of ``length`` rows, the same count on every rank.

    By default the rows are padded to a multiple of ``size`` by repeating the
    first rows (as DistributedSampler does: at most ``size - 1`` repeats per
    epoch); ``drop_remainder=True`` leaves the last ``length % size`` rows out instead.
    """
    if not 0 <= rank < size:
        raise UserError(f"rank {rank} is outside 0..{size - 1}")
    if length < 1 or (drop_remainder and length < size):
        raise UserError(f"{length} rows cannot be split over {size} ranks"
                        f"{' with drop_remainder=True' if drop_remainder else ''}: give at least {size} rows")
    total = (length // size) * size if drop_remainder else math.ceil(length / size) * size
    return [i % length for i in range(rank, total, size)]


def shard_slice(length: int, rank: int, size: int, *, drop_remainder: bool = False) -> tuple[slice, list[int]]:
    """:func:`shard_indices` as a slice of the rows plus the padding rows (at most one per rank)."""
    rows = shard_indices(length, rank, size, drop_remainder=drop_remainder)
    end = (length // size) * size if drop_remainder else length
    own = len(range(rank, end, size))
    return slice(rank, end, size), rows[own:]


def take_shard(data: Any, rank: int, size: int, *, drop_remainder: bool = False) -> Any:
    """This rank's rows of a numpy array, pandas DataFrame/Series or list (a view where the type has one).

    The slice keeps memory maps and h5py datasets lazy and pandas rows by
    position (``.iloc``); the padding rows are appended to it.
    """
    import numpy as np

    part, pad = shard_slice(len(data), rank, size, drop_remainder=drop_remainder)
    rows = data.iloc if hasattr(data, "iloc") else data
    head = rows[part]
    if not pad:
        return head
    if hasattr(data, "iloc"):
        import pandas as pd

        return pd.concat([head, data.iloc[pad]])
    if isinstance(data, list):
        return head + [data[i] for i in pad]
    return np.concatenate([np.asarray(head), np.asarray(data[pad])])


def take_unpadded(data: Any, rank: int, size: int, *, drop_remainder: bool = False) -> Any:
    """Rows ``rank, rank + size, ...`` of ``data``, every row once (ranks may differ by one row); no padding."""
    return (data.iloc if hasattr(data, "iloc") else data)[rank::size]


def shard_together(arrays: tuple, rank: int, size: int, *, drop_remainder: bool = False,
                   take: Callable[..., Any] = take_shard) -> Any:
    """This rank's rows of each of ``arrays`` (x and y stay paired); one array alone comes back unwrapped.

    ``take(array, rank, size, drop_remainder=...)`` cuts one array; the
    adapters pass their own for framework tensors.
    """
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise UserError(f"arrays have different lengths {sorted(lengths)}: pass x and y of the same samples")
    shards = tuple(take(a, rank, size, drop_remainder=drop_remainder) for a in arrays)
    return shards if len(shards) > 1 else shards[0]


def resume_indices(order: Sequence[int], start: int, rank: int, size: int, *, drop_last: bool = False) -> list[int]:
    """This rank's share of an epoch's ``order`` from global position ``start`` on, over ``size`` ranks.

    A sampler that gives rank r the rows ``order[r::size]`` (torch's
    DistributedSampler, ``shard_arrays``) has, after k batches of B on every
    rank, consumed exactly the prefix ``order[:k*B*size]``. So the position
    to store is that count of samples, not a rank's batch index, and a job
    resumed on another number of ranks continues with the rest of the same
    order: ``order[start:]`` dealt over the new ranks, none skipped and none
    seen twice. As DistributedSampler does, the rest is padded to a multiple
    of ``size`` by repeating the epoch's first rows (``drop_last``: cut
    instead). With ``start=0`` this is DistributedSampler's own split.

    Example::

        resume_indices(list(range(10)), start=6, rank=0, size=3)   # [6, 9]: rows 6-9 and 0 as padding, dealt 3 ways
    """
    if not 0 <= rank < size:
        raise UserError(f"rank {rank} is outside 0..{size - 1}")
    if start < 0:
        raise UserError(f"start {start} is negative")
    rest = list(order[start:])
    if drop_last:
        rest = rest[:len(rest) // size * size]
    elif rest and len(rest) % size:
        pad = size - len(rest) % size
        rest += (list(order) * math.ceil(pad / len(order)))[:pad]
    return rest[rank::size]


def samples_done(start: int, batches: int, batch_size: int, size: int, total: int,
                 pass_batches: int | None = None) -> int:
    """Samples of an epoch the whole job has trained on: ``start``, plus ``batches`` batches on each of ``size`` ranks.

    What a checkpoint stores as the data position (the torch sampler's and
    the Keras batches' ``position``), for :func:`resume_indices`. Capped at the
    epoch's ``total``; once the pass's ``pass_batches`` are done it is the
    whole epoch, so rows a ``drop_last`` pass cut are not resumed onto.
    """
    if pass_batches is not None and batches >= pass_batches:
        return total
    return min(start + batches * batch_size * size, total)


def slice_range(numel: int, rank: int, size: int) -> tuple[int, int]:
    """The elements ``[start, end)`` of a flattened tensor of ``numel`` elements that ``rank`` holds in sharded
    optimizer state (both adapters): ``ceil(numel / size)`` each, the last ranks fewer or none."""
    chunk = math.ceil(numel / size)
    return min(rank * chunk, numel), min((rank + 1) * chunk, numel)


def check_batch_size(batch_size) -> None:
    """A batch of at least one sample, as both adapters' loaders take it."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise UserError(f"batch_size must be an integer of at least 1, got {batch_size!r}")


def check_same_loads(backend, caller: str, held, fix: str) -> None:
    """Before sharded optimizer state is gathered: every rank is in this call, and every rank loaded the same.

    ``held`` is this rank's summary of what it loaded (equal on ranks that loaded
    the same state); ``fix`` says, in the adapter's terms, how to load on every
    rank. One small allgather, named after ``caller`` so that a deadlock line
    names the call. A rank left alone in it, because the others had finished or
    called something else, raises one line naming the call instead of waiting.
    """
    def alone(why: str) -> UserError:
        return UserError(f"{caller} is collective with shard_optimizer_state (every rank sends its slices), and "
                         f"{why}: call it on every rank, not under `if ctx.is_main:` (only rank 0 writes the file)")

    try:
        gathered = backend.allgather_object((caller, held), name=f"{caller}.sharded_state")
    except Exception as exc:
        # The stall inspector ended Horovod, or (outside an elastic job, whose reset handles a lost rank) the
        # others' connections closed as they exited: either way they never came.
        failed = type(exc).__name__ == "HorovodInternalError"
        if failed and topology.is_elastic():
            raise               # a lost worker: the elastic run restores the last commit and goes on
        if "shut down" in str(exc) or failed:
            raise alone("Horovod has been shut down while this rank waited for the others, which had finished or "
                        "were in another collective") from exc
        raise
    # TensorFlow's eager collectives pair up in call order, whatever their names: a rank in another call sent
    # something else.
    if any(not (isinstance(x, tuple) and len(x) == 2 and x[0] == caller) for x in gathered):
        raise alone("the other ranks were in another collective")
    loads = [x[1] for x in gathered]
    if len(set(loads)) > 1:
        raise UserError(f"the ranks hold different optimizer states (per rank: {loads}): with "
                        f"shard_optimizer_state, load on every rank ({fix})")
