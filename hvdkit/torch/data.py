"""Data sharding: each rank its own part of the training set, and all of the evaluation set between them.

Example::

    train_loader = hk.distributed_loader(train_set, batch_size=64, shuffle=True)
    test_loader = hk.eval_loader(test_set, batch_size=256)
    for epoch in range(epochs):
        train_loader.sampler.set_epoch(epoch)   # a new shuffle each epoch, the same on every rank
        ...
    metrics = hk.evaluate(model, test_loader)   # exact over the whole test set (hvdkit/torch/metrics.py)
"""

from __future__ import annotations

import gc
import logging
import math
import multiprocessing
import random

import numpy as np
import torch
from torch.utils.data import (
    ConcatDataset,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    Subset,
    TensorDataset,
)
from torch.utils.data.distributed import DistributedSampler

from hvdkit.common.errors import UserError
from hvdkit.runtime import context
from hvdkit.runtime.datacheck import same_everywhere
from hvdkit.runtime.integrity import content_digest
from hvdkit.runtime.sharding import (
    check_batch_size,
    resume_indices,
    samples_done,
    shard_slice,
    shard_together,
    take_shard,
)
from hvdkit.runtime.topology import loader_workers
from hvdkit.torch.checkpoint import tensor_bytes
from hvdkit.torch.context import ADAPTER, current

log = logging.getLogger("hvdkit.torch")


class ResumableDistributedSampler(DistributedSampler):
    """DistributedSampler that can start mid-epoch, on any number of ranks.

    ``loader.sampler.position(k)`` is how many samples of the epoch the
    whole job has consumed once every rank has taken k batches since
    ``set_epoch``: store that count in the checkpoint, with the epoch. On
    resume, ``set_epoch(epoch, start_sample=count)`` continues the same
    epoch order from there on however many ranks the job now has, so no
    sample is skipped or seen twice (:func:`hvdkit.runtime.sharding.resume_indices`).
    A rank's batch index alone is not enough: 14 batches of 10 on 2 ranks
    are 280 samples, on 3 ranks 420. ``set_epoch(epoch, start_batch=k)``
    still means k batches at the current size.

    A shuffling sampler that starts passes in the same order logs one
    warning, since every epoch would see the same order: at its second pass
    when ``set_epoch`` was never called, at its third since the last
    ``set_epoch`` otherwise (a second pass in one epoch is often an
    evaluation on the training data).
    """

    def __init__(self, dataset: Dataset, *, num_replicas: int, rank: int, shuffle: bool,
                 seed: int, drop_last: bool, batch_size: int):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle,
                         seed=seed, drop_last=drop_last)
        self.batch_size = batch_size
        self.start_sample = 0
        self._passes_since_set_epoch = 0
        self._set_epoch_called = False
        self._warned = False

    def set_epoch(self, epoch: int, start_batch: int = 0, *, start_sample: int | None = None) -> None:
        """Start ``epoch`` after ``start_sample`` of its samples (all ranks together), or ``start_batch`` a rank."""
        super().set_epoch(epoch)
        if start_sample is not None and start_batch:
            raise UserError("give start_batch or start_sample, not both")
        self.start_sample = start_batch * self.batch_size * self.num_replicas if start_sample is None else start_sample
        if self.start_sample < 0:
            raise UserError(f"start_sample must be >= 0, got {self.start_sample}")
        self._passes_since_set_epoch = 0
        self._set_epoch_called = True

    def position(self, batches: int) -> int:
        """Samples of this epoch the job has consumed after ``batches`` batches a rank since ``set_epoch``."""
        return samples_done(self.start_sample, batches, self.batch_size, self.num_replicas, len(self.dataset))

    def _order(self) -> list[int]:
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)       # DistributedSampler's own order
        return torch.randperm(n, generator=g).tolist()

    def __iter__(self):
        self._passes_since_set_epoch += 1
        same_order_limit = 3 if self._set_epoch_called else 2
        if self.shuffle and not self._warned and self._passes_since_set_epoch >= same_order_limit:
            self._warned = True
            log.warning("hvdkit: the sampler starts another pass with the same order as the last (epoch %d), since "
                        "set_epoch was not called: call train_loader.sampler.set_epoch(epoch) at the start of each "
                        "epoch", self.epoch)
        return iter(resume_indices(self._order(), self.start_sample, self.rank, self.num_replicas,
                                   drop_last=self.drop_last))

    def __len__(self) -> int:
        n = len(self.dataset)
        rest = max(n - self.start_sample, 0)
        if self.drop_last:
            return rest // self.num_replicas
        return math.ceil(rest / self.num_replicas)


def distributed_loader(dataset: Dataset, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                       drop_last: bool = False, num_workers: int | None = None, pin_memory: bool | None = None,
                       **loader_kwargs) -> DataLoader:
    """A DataLoader over this rank's shard (1/size of the data), ``batch_size`` per rank.

    Call ``loader.sampler.set_epoch(epoch)`` each epoch. On a GPU, by default,
    batches are prepared by up to 4 worker processes per rank (its share of the
    host's cores, less one) into pinned memory, so the step does not wait for
    them; on the CPU they are made in the training process. Workers persist
    across epochs. A ``TensorDataset`` already on the GPU gets neither.
    """
    check_batch_size(batch_size)
    ctx = current()
    sampler = ResumableDistributedSampler(dataset, num_replicas=ctx.size, rank=ctx.rank, shuffle=shuffle,
                                          seed=seed, drop_last=drop_last, batch_size=batch_size)
    on_gpu = ctx.device.type == "cuda" and not _on_gpu_already(dataset)
    if num_workers is None:
        num_workers = loader_workers(ctx.local_size, on_gpu)
    if pin_memory is None:
        pin_memory = on_gpu
    if num_workers > 0 and on_gpu and "forkserver" in multiprocessing.get_all_start_methods():
        # As Horovod's examples do: workers forked from a rank whose MPI or InfiniBand stack is not fork-safe
        # can hang or crash; forkserver starts them from a clean process.
        loader_kwargs.setdefault("multiprocessing_context", "forkserver")
    # A DataLoader draws its workers' base seed from torch's global generator each time an epoch's
    # iterator starts; one of its own leaves the global stream (dropout) to the model, so a run resumed
    # with the checkpoint's RNG state draws exactly what the uninterrupted run did.
    # Its seed mixes in the rank, so the ranks' workers draw different augmentations (as Lightning seeds them).
    loader_kwargs.setdefault("generator", torch.Generator().manual_seed(seed + 1_000_003 * ctx.rank))
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      pin_memory=pin_memory, persistent_workers=num_workers > 0, **loader_kwargs)


def _on_gpu_already(dataset) -> bool:
    """A TensorDataset of CUDA tensors, or a Subset or ConcatDataset of one: workers could not share them and
    pinning refuses them."""
    if isinstance(dataset, Subset):
        return _on_gpu_already(dataset.dataset)
    if isinstance(dataset, ConcatDataset):
        return any(_on_gpu_already(d) for d in dataset.datasets)
    return isinstance(dataset, TensorDataset) and any(t.is_cuda for t in dataset.tensors)


def shard_arrays(*tensors, drop_remainder: bool = False):
    """Rows rank, rank+size, ... of each tensor or array, the same number on every rank.

    For data held in tensors rather than a Dataset: every rank then runs the
    same number of steps (uneven shards deadlock at the last batch). Rows are
    padded by repeating the first ones, as DistributedSampler pads, or with
    ``drop_remainder=True`` the last ``len % size`` rows are left out.

    Example::

        x_train, y_train = hk.shard_arrays(x_train, y_train)
        for i in range(0, len(x_train), batch_size): ...
    """
    ctx = current()
    return shard_together(tensors, ctx.rank, ctx.size, drop_remainder=drop_remainder, take=_take_rows)


def _take_rows(t, rank: int, size: int, *, drop_remainder: bool):
    """A tensor's shard: a view of its rows, plus the padding row; anything else goes to the core."""
    if not isinstance(t, torch.Tensor):
        return take_shard(t, rank, size, drop_remainder=drop_remainder)
    part, pad = shard_slice(len(t), rank, size, drop_remainder=drop_remainder)
    return torch.cat([t[part], t[pad]]) if pad else t[part]


class ShardSampler(Sampler[int]):
    """Indices rank, rank+size, ... with no padding: shards differ by at most one sample.

    DistributedSampler pads the last shard with repeated samples so every rank
    has the same count; that is right for training and wrong for evaluation,
    where the repeats are counted twice.
    """

    def __init__(self, length: int, rank: int, size: int):
        self.indices = list(range(rank, length, size))

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def eval_loader(dataset: Dataset, batch_size: int, **loader_kwargs) -> DataLoader:
    """A DataLoader over this rank's unpadded evaluation shard (see :class:`ShardSampler`).

    It draws its workers' seed from a generator of its own: a DataLoader without
    one takes a number from torch's global generator at every pass, so an
    evaluation that a resumed job skips (one preempted on an epoch's last batch)
    would shift every later dropout mask against the uninterrupted run.
    """
    ctx = current()
    loader_kwargs.setdefault("generator", torch.Generator().manual_seed(2_000_003 + ctx.rank))
    return DataLoader(dataset, batch_size=batch_size, sampler=ShardSampler(len(dataset), ctx.rank, ctx.size),
                      **loader_kwargs)


def check_loader_sharded() -> bool:
    """Once, at the first step, on every rank: warn (rank 0) when every rank iterates the same whole dataset.

    A script that keeps its single-process ``DataLoader(dataset, shuffle=True)``
    trains every rank on all the data: as many steps an epoch as one process,
    so no speed-up, and nothing fails. The loader being iterated at the first
    ``step()`` is found among the live DataLoader iterators; if its sampler
    draws from the whole dataset (a ``RandomSampler`` or ``SequentialSampler``),
    the ranks compare the dataset's type, length and three of its samples, so
    the check holds whatever order each rank shuffles in. Ranks whose
    datasets differ (sharded by hand) are not warned; nor are samples with
    random augmentation, which differ every time they are read. One gather,
    once; the samples are read with the random generators' states restored.
    """
    backend = context.backend(ADAPTER)
    dataset = _whole_dataset_in_use()
    # Type and length first; the samples are read only when those agree everywhere (reading one in the main
    # process opens what a dataset opens lazily, an HDF5 file, before its workers fork).
    key = f"{type(dataset).__name__}:{len(dataset)}" if dataset is not None else None
    if not same_everywhere(backend, key, name="hvdkit.loader_kind"):
        return False
    if not same_everywhere(backend, _samples_digest(dataset), name="hvdkit.loader_data"):
        return False
    ctx = current()
    if ctx.rank == 0:
        length = len(dataset)
        log.warning("hvdkit: every rank iterates the same %s samples (a DataLoader without a distributed sampler), so "
                    "each of the %d ranks trains on all of them and the job is no faster than one process: build it "
                    "with hk.distributed_loader(dataset, batch_size) and call loader.sampler.set_epoch(epoch) each "
                    "epoch", length, ctx.size)
    return True


def _whole_dataset_in_use():
    """The dataset behind the one DataLoader iterated now, if its sampler reads all of it; else None."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    # type(), not isinstance(): isinstance reads __class__, which some lazy objects answer with a
    # warning (torch.distributed.reduce_op: a FutureWarning on every rank).
    iterators = [o for o in gc.get_objects() if issubclass(type(o), _BaseDataLoaderIter)]
    whole = []
    for it in iterators:
        sampler = getattr(it._index_sampler, "sampler", it._index_sampler)   # a BatchSampler's own sampler
        if not isinstance(sampler, (RandomSampler, SequentialSampler)):
            return None                      # a sharded (or custom) sampler is in use: trust it
        if not isinstance(it._dataset, IterableDataset) and len(it._dataset) == len(sampler):
            whole.append(it._dataset)
    return whole[0] if len(whole) == 1 and len(whole[0]) else None


def _samples_digest(dataset) -> str | None:
    """A digest of three samples (first, middle, last), read with the random generators' states restored."""
    n = len(dataset)
    states = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):     # a sample's random transform must not move the user's stream
            samples = [dataset[i] for i in sorted({0, n // 2, n - 1})]
        return content_digest(samples, tensor_bytes)["sha256"][:16]
    except Exception:  # noqa: BLE001 - a dataset that cannot be read this way only loses the check
        return None
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
