"""Elastic training on Horovod's elastic mode: survive lost workers, shrink and grow.

Launch with Gloo and a host discovery script (or a fixed -H and --min-np)::

    horovodrun -np 4 --min-np 2 --max-np 8 --host-discovery-script examples/discover_hosts.sh \\
        python examples/pytorch_elastic.py

In the script::

    train_loader = hk.elastic.elastic_loader(train_set, batch_size=32, seed=0)
    state = hk.elastic.ElasticState(model, optimizer, sampler=train_loader.sampler, base_lr=0.01)

    @hk.elastic.run                     # on a lost worker or a host change: restore, re-sync, retry
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for x, y in train_loader:
                ...one step...
                state.step_done(len(x))   # count the batch; commit every commit_every steps
            state.epoch_done()

What a commit holds: model, optimizer, epoch, step, and the sampler's
position (samples consumed this epoch). After a reset every worker goes back
to the last commit, rank 0's state is broadcast (new workers get it too), the
data is re-sharded over the new world size from the first unconsumed sample,
and the learning rate is rescaled to ``base_lr x size``. ``run``, the commits
and the rescaling are the core's (:mod:`hvdkit.runtime.elastic`), as in Keras.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from hvdkit.backends.torch import hvd
from hvdkit.common.errors import UserError
from hvdkit.runtime.elastic import ElasticCommits, run
from hvdkit.torch.context import current
from hvdkit.torch.sharded import is_sharded


def elastic_loader(dataset: Dataset, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                   num_workers: int = 0, **loader_kwargs) -> DataLoader:
    """A DataLoader over this rank's shard that re-shards when the world size changes.

    Uses Horovod's ElasticSampler, which skips the samples already consumed
    this epoch (by any rank) after a reset.
    """
    current()
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=shuffle, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers, **loader_kwargs)


class ElasticState(ElasticCommits, hvd.elastic.TorchState):
    """Horovod's TorchState plus: step counting, commit hooks, LR rescaling and context refresh on reset.

    ``base_lr`` is the single-process learning rate (one value for every
    param group, or a list); on every reset each group's lr becomes
    ``base_lr x size`` (see :func:`hvdkit.runtime.lr.scale_lr`). ``commit_every``
    is how many steps pass between commits (a commit copies model and
    optimizer state to host memory). ``sampler`` is the loader's
    ElasticSampler: where the epoch stands lives there (in Keras, in the
    state's own ``shard``). Other keywords are kept in the state, as in Horovod.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 base_lr: float | list[float] | None = None, commit_every: int = 1, epoch: int = 0,
                 step: int = 0, sampler=None, **kwargs):
        current()
        if sampler is not None and not isinstance(sampler, hvd.elastic.ElasticSampler):
            raise UserError(f"sampler is a {type(sampler).__name__}: build the loader with hk.elastic.elastic_loader() "
                            "so the data is re-sharded when workers come and go")
        if is_sharded(optimizer):
            raise UserError("an elastic job cannot use shard_optimizer_state yet (the slices would have to be "
                            "re-cut when the world size changes): leave it off in elastic jobs")
        groups = len(optimizer.param_groups)
        if base_lr is not None and not isinstance(base_lr, (list, tuple)):
            base_lr = [base_lr] * groups
        self._init_commits(commit_every, list(base_lr) if base_lr is not None else None)
        extra = {"train_sampler": sampler} if sampler is not None else {}
        super().__init__(model=model, optimizer=optimizer, epoch=epoch, step=step, **extra, **kwargs)
        self.register_reset_callbacks([self._after_reset])
        self._after_reset()

    def _set_learning_rates(self, rates: list[float]) -> None:
        for group, rate in zip(self.optimizer.param_groups, rates):
            group["lr"] = rate

    def _consume(self, samples: int) -> None:
        if getattr(self, "train_sampler", None) is not None:
            self.train_sampler.record_batch(0, samples)

    def _start_epoch(self) -> None:
        if getattr(self, "train_sampler", None) is not None:
            self.train_sampler.set_epoch(self.epoch)


__all__ = ["ElasticState", "elastic_loader", "run"]
