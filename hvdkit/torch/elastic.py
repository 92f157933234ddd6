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
and the learning rate is rescaled to ``base_lr x size``. With
``shard_optimizer_state=True`` a commit gathers the optimizer's slices from
every rank, and a reset cuts them again for the new rank and size
(:class:`ShardedOptimizerHandler`). ``run``, the commits
and the rescaling are the core's (:mod:`hvdkit.runtime.elastic`), as in Keras.
"""

from __future__ import annotations

import copy

import torch
from torch.utils.data import DataLoader, Dataset

import hvdkit.torch.sharded as sharded
from hvdkit.backends.torch import hvd
from hvdkit.common.errors import UserError
from hvdkit.runtime import context
from hvdkit.runtime.elastic import ElasticCommits, run
from hvdkit.torch.averaging import abandon_window
from hvdkit.torch.context import ADAPTER, current
from hvdkit.torch.global_batch import GlobalBatchLoader
from hvdkit.torch.tensors import to_cpu


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
    optimizer state to host memory; a sharded optimizer's is gathered first). ``sampler`` is the loader's
    ElasticSampler: where the epoch stands lives there (in Keras, in the
    state's own ``shard``). A ``torch.amp.GradScaler`` given as a keyword
    (``scaler=scaler``) is committed, restored and synced from rank 0 with the
    rest (:class:`GradScalerHandler`): a worker that joins would otherwise scale
    its loss by its scaler's initial scale. Other keywords are kept in the
    state, as in Horovod.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 base_lr: float | list[float] | None = None, commit_every: int = 1, epoch: int = 0,
                 step: int = 0, sampler=None, **kwargs):
        current()
        register_sharded_handler()          # Horovod's TorchState picks each handler from it below
        if sampler is not None and not isinstance(sampler, (hvd.elastic.ElasticSampler, GlobalBatchLoader)):
            raise UserError(f"sampler is a {type(sampler).__name__}: build the loader with hk.elastic.elastic_loader() "
                            "(or hk.global_batch_loader()) so the data is re-sharded when workers come and go")
        if isinstance(sampler, GlobalBatchLoader):
            if base_lr is not None:
                raise UserError("base_lr is rescaled to base_lr x size at each reset, and a fixed global batch keeps "
                                "one rate at any size: leave base_lr out (the optimizer's rate stays)")
            if not sampler.micro_batch_given:
                raise UserError("without micro_batch, hk.global_batch_loader cuts micro-batches for the size it was "
                                "built at, and a worker that joins an elastic job would cut them for another: give "
                                "micro_batch= (the same in every process)")
            register_global_batch_handler()
        groups = len(optimizer.param_groups)
        if base_lr is not None and not isinstance(base_lr, (list, tuple)):
            base_lr = [base_lr] * groups
        self._init_commits(commit_every, list(base_lr) if base_lr is not None else None)
        extra = {"train_sampler": sampler} if sampler is not None else {}
        scalers = {k: v for k, v in kwargs.items() if isinstance(v, torch.amp.GradScaler)}
        kwargs = {k: v for k, v in kwargs.items() if k not in scalers}
        super().__init__(model=model, optimizer=optimizer, epoch=epoch, step=step, **extra, **kwargs)
        # The sharded optimizers' handlers save first: their gather is collective and may fail on a lost rank,
        # which must find the model, sampler and counters still at the last commit, not saved past it.
        self._handlers = dict(sorted(self._handlers.items(),
                                     key=lambda item: not isinstance(item[1], ShardedOptimizerHandler)))
        for name, scaler in scalers.items():      # Horovod has no handler for them: it would pickle a copy
            self._handlers[name] = GradScalerHandler(scaler)
            setattr(self, name, scaler)
        self.register_reset_callbacks([self._after_reset])
        self._after_reset()
        # Registered after the first _after_reset: only a reset has a step in flight to drop.
        self.register_reset_callbacks([self._drop_step_in_flight])

    def _drop_step_in_flight(self) -> None:
        for handler in self._handlers.values():      # the optimizer, and any other given as a keyword
            if isinstance(handler.value, torch.optim.Optimizer):
                abandon_window(handler.value)
            elif isinstance(handler, GradScalerHandler):
                handler.value._per_optimizer_states.clear()   # "unscaled" from a step that was dropped

    def _after_reset(self) -> None:
        for handler in self._handlers.values():
            if isinstance(handler, ShardedOptimizerHandler):
                handler.recut()     # first: loading the committed state also loads its (old) rates
        super()._after_reset()

    def _set_learning_rates(self, rates: list[float]) -> None:
        for group, rate in zip(self.optimizer.param_groups, rates):
            group["lr"] = rate

    def _consume(self, samples: int) -> None:
        # A global-batch loader counts its own steps (as optimizer.step() returns).
        if isinstance(getattr(self, "train_sampler", None), hvd.elastic.ElasticSampler):
            self.train_sampler.record_batch(0, samples)

    def _start_epoch(self) -> None:
        if getattr(self, "train_sampler", None) is not None:
            self.train_sampler.set_epoch(self.epoch)


class GradScalerHandler(hvd.elastic.state.StateHandler):
    """A ``torch.amp.GradScaler`` given to :class:`ElasticState` as a keyword (``scaler=scaler``).

    Each rank multiplies its loss by its own scale before the gradients are averaged, and divides by it
    after: ranks whose scales differ average differently scaled gradients and step apart, silently. A worker
    that joins starts from its scaler's initial scale, the others from where theirs moved, so ``sync``
    gives every rank rank 0's scale (with its growth count); commits keep it, and a restore takes it back."""

    def __init__(self, scaler):
        super().__init__(scaler)
        self._saved = None

    def save(self):
        if self.value.is_enabled():
            self._saved = dict(self.value.state_dict())

    def restore(self):      # (the reset that follows clears its per-optimizer stages: _drop_step_in_flight)
        if self._saved is not None:
            self.value.load_state_dict(self._saved)

    def sync(self):
        if self.value.is_enabled():
            self.value.load_state_dict(_backend().broadcast_object(self.value.state_dict(), root_rank=0,
                                                                   name="hvdkit.elastic.scaler"))
        self.save()


class ShardedOptimizerHandler(hvd.elastic.state.StateHandler):
    """Horovod's optimizer handler for ``shard_optimizer_state=True``: commits hold the consolidated state.

    A commit gathers every rank's slices (``state_dict()``, collective: every
    rank commits at the same step) into host memory, so that the survivors of
    a lost rank still hold all of the state. After a reset the slices are cut
    again for the new rank and size from that copy (:meth:`recut`, local), and
    ``sync`` sends it to new workers (when every rank holds the same commit,
    as after a failure that brought no new worker, nothing is sent). Nothing here is collective outside ``save`` and
    ``sync``: a worker that joins builds this handler while the others are
    already in ``sync``. :class:`ElasticState` saves this handler before the
    others, so that a rank lost during the gather leaves the last commit whole.
    """

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self._saved_optimizer_state = None        # nothing committed yet (and nothing gathered: see above)
        self._commits = 0                         # commits saved: the same count on every rank that made them

    def save(self):
        self._saved_optimizer_state = _detached(self.value.state_dict())
        self._commits += 1

    def _committed(self) -> dict:
        """The last commit, or before the first one the optimizer's groups with no state."""
        if self._saved_optimizer_state is not None:
            return self._saved_optimizer_state
        return {"state": {}, "param_groups": torch.optim.Optimizer.state_dict(self.value)["param_groups"]}

    def restore(self):
        # Back to the last commit in the slices cut now; a reset that follows cuts them again (recut). Before the
        # first commit (a failure in the job's first sync) nothing has trained: the state stays as it is.
        if self._saved_optimizer_state is not None:
            sharded.reshard(self.value, *sharded.layout(self.value), self._saved_optimizer_state)

    def recut(self):
        """After a reset: cut the slices for this rank and size from the last commit, if the layout changed."""
        now = (_backend().rank(), _backend().size())
        if sharded.layout(self.value) != now:
            sharded.reshard(self.value, *now, self._committed())

    def sync(self):
        self.recut()                    # also when a plain hvd.elastic.TorchState holds this optimizer
        backend = _backend()
        rank = backend.rank()
        held = backend.allgather_object(self._commits if self._saved_optimizer_state is not None else None,
                                        name="hvdkit.elastic.shards")
        if None not in held and len(set(held)) == 1:
            return                      # every rank holds the same commit, cut for it (a failure, no new worker)
        holders = [r for r, commits in enumerate(held) if commits is not None]
        if not holders:                 # the job's first sync: the state as it stands (loaded or empty), gathered
            self.save()                 # onto every rank, which then holds the same
            return
        root = holders[0]               # rank 0, which syncs the model, unless it is new
        state = None
        if rank == root:                # the committed state, with the rates as they are now (rescaled for size)
            state = (to_cpu({**self._saved_optimizer_state,
                             "param_groups": torch.optim.Optimizer.state_dict(self.value)["param_groups"]}),
                     self._commits)
        state, self._commits = backend.broadcast_object(state, root_rank=root, name="hvdkit.elastic.shards.state")
        if rank != root:
            sharded.reshard(self.value, rank, backend.size(), state)
        self._saved_optimizer_state = state


class GlobalBatchHandler(hvd.elastic.state.StateHandler):
    """A fixed global batch's place in the run (epoch, steps done), committed with the model: after a reset the
    steps go on from the commit's, cut for the new world size. The loader itself (its dataset) is not copied."""

    def __init__(self, loader: GlobalBatchLoader):
        super().__init__(loader)
        self.save()

    def save(self):
        self._saved = self.value.state_dict()

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        self.value.load_state_dict(_backend().broadcast_object(self.value.state_dict(), root_rank=0,
                                                               name="hvdkit.elastic.global_batch"))


def register_global_batch_handler() -> None:
    """Put :class:`GlobalBatchHandler` in Horovod's registry, once: without it the state would pickle the loader."""
    registry = hvd.elastic.state.get_handler_registry()
    if not any(handler is GlobalBatchHandler for _, handler in registry):
        hvd.elastic.state.set_handler_registry([*registry, (GlobalBatchLoader, GlobalBatchHandler)])


def _detached(state_dict: dict) -> dict:
    """A consolidated state_dict apart from the live optimizer: its per-parameter scalars (step counts) are the
    inner optimizer's own tensors, cloned here; the moments were gathered into new memory already."""
    def own(key, value):
        scalar = torch.is_tensor(value) and (key in sharded.SCALAR_KEYS or not value.dim())
        return value.detach().clone() if scalar else value

    return {"param_groups": copy.deepcopy(state_dict["param_groups"]),
            "state": {i: {k: own(k, v) for k, v in entry.items()} for i, entry in state_dict["state"].items()}}


def _backend():
    return context.backend(ADAPTER)       # also between an elastic reset's shutdown and init


class _ShardedOptimizer(type):
    """isinstance(x, ShardedOptimizer) is True for an optimizer with shard_optimizer_state (Horovod's handler
    registry picks a state's handler by isinstance, and its own would gather the slices in every constructor)."""

    def __instancecheck__(cls, obj) -> bool:
        return sharded.is_sharded(obj)


class ShardedOptimizer(metaclass=_ShardedOptimizer):
    pass


def register_sharded_handler() -> None:
    """Put the sharded optimizers' handler first in Horovod's registry, once (for hvdkit's ElasticState and for
    Horovod's own TorchState alike): when an optimizer is first sharded, not at import, so that importing
    hvdkit.torch leaves Horovod's globals as they were."""
    registry = hvd.elastic.state.get_handler_registry()
    if not any(handler is ShardedOptimizerHandler for _, handler in registry):
        hvd.elastic.state.set_handler_registry([(ShardedOptimizer, ShardedOptimizerHandler), *registry])

__all__ = ["ElasticState", "elastic_loader", "run"]
