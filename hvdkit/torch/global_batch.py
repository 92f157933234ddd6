"""A fixed global batch for torch: the same model at any world size (:mod:`hvdkit.runtime.global_batch`).

Example::

    loader = hk.global_batch_loader(train_set, global_batch=256, micro_batch=32, seed=0)
    optimizer = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, global_batch=loader)
    hk.broadcast_state(model, optimizer)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for step in loader:                  # one optimizer step: the same 256 samples on 1, 3 or 8 ranks
            optimizer.zero_grad()
            for x, y in step:                # this rank's micro-batches of it (none when there are more ranks)
                F.cross_entropy(model(x), y).backward()     # a mean loss, as in one process
            optimizer.step()

The loop is the single-process gradient-accumulation loop. What hvdkit does
around it: each micro-batch's gradient is weighted by its share of the step (a
hook on each parameter's gradient), Horovod sums the ranks' gradients once a
step, as the rank's last micro-batch's ``backward()`` returns (a rank with no
micro-batch joins with zeros when its ``for x, y in step`` ends), and torch's
random generator is seeded for each micro-batch by its place in the run while
it is being computed (dropout), then put back. The learning rate is the one for
the global batch at any size: no ``scale_lr``, no resize rescaling.
"""

from __future__ import annotations

import logging

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from hvdkit.common.errors import UserError
from hvdkit.runtime import context
from hvdkit.runtime.global_batch import GlobalBatch
from hvdkit.runtime.optimizer_record import record_of
from hvdkit.runtime.topology import loader_workers
from hvdkit.torch.context import ADAPTER, current

log = logging.getLogger("hvdkit.torch")

LOSS_REDUCTIONS = ("mean", "sum")


def global_batch_loader(dataset: Dataset, global_batch: int, micro_batch: int | None = None, *,
                        shuffle: bool = True, seed: int = 0, drop_last: bool = False, loss_reduction: str = "mean",
                        num_workers: int | None = None, pin_memory: bool | None = None,
                        **loader_kwargs) -> GlobalBatchLoader:
    """Steps of ``global_batch`` samples, each cut into micro-batches of ``micro_batch``, shared round-robin.

    Iterating it gives one :class:`GlobalStep` per optimizer step; iterating a
    step gives this rank's micro-batches, collated as a DataLoader would
    (``loader_kwargs`` go to the DataLoader: ``collate_fn``, ...). Without
    ``micro_batch`` each rank takes one micro-batch of ``ceil(global / size)``:
    the gradient is still the global batch's mean at any size, but BatchNorm and
    dropout then see other groupings on another size. ``loss_reduction`` says
    what the script's loss is over a micro-batch: its ``"mean"`` (as torch's
    losses by default) or its ``"sum"``. The last step of an epoch has the
    samples left (``drop_last=True``: none). Pass the loader to
    ``hk.DistributedOptimizer(..., global_batch=loader)``.
    """
    if loss_reduction not in LOSS_REDUCTIONS:
        raise UserError(f"loss_reduction={loss_reduction!r}: give 'mean' (the loss is a micro-batch's mean, torch's "
                        "default) or 'sum'")
    for name in ("batch_size", "sampler", "batch_sampler", "shuffle", "drop_last", "persistent_workers"):
        if name in loader_kwargs:
            raise UserError(f"global_batch_loader cuts the batches itself: leave out {name}= (the DataLoader "
                            "keyword), and give global_batch, micro_batch, shuffle or drop_last")
    ctx = current()
    plan = GlobalBatch.for_size(global_batch, micro_batch, len(dataset), ctx.size, drop_last)
    on_gpu = ctx.device.type == "cuda"
    if num_workers is None:
        num_workers = loader_workers(ctx.local_size, on_gpu)
    if pin_memory is None:
        pin_memory = on_gpu
    loader = GlobalBatchLoader(dataset, plan, shuffle=shuffle, seed=seed, loss_reduction=loss_reduction,
                               num_workers=num_workers, pin_memory=pin_memory, **loader_kwargs)
    loader.micro_batch_given = micro_batch is not None
    return loader


class _RankMicroBatches(Sampler[list[int]]):
    """The DataLoader's batch sampler: this rank's micro-batches, as dataset indices, for the rest of the epoch."""

    def __init__(self, loader: GlobalBatchLoader):
        self.loader = loader

    def __iter__(self):
        loader = self.loader
        order, rank, size = loader._order(), loader._rank(), loader._size()
        for step in range(loader.steps_done, loader.plan.steps_per_epoch()):
            bounds = loader.plan.micro_batches(step)
            for micro in loader.plan.share(step, rank, size):
                start, stop = bounds[micro]
                yield order[start:stop]

    def __len__(self) -> int:
        loader = self.loader
        rank, size = loader._rank(), loader._size()
        return sum(len(loader.plan.share(s, rank, size))
                   for s in range(loader.steps_done, loader.plan.steps_per_epoch()))


class GlobalBatchLoader:
    """See :func:`global_batch_loader`. ``steps_done``: the steps of this epoch whose micro-batches were all taken
    (a checkpoint after ``optimizer.step()`` resumes with the next step; a step a GradScaler skipped counts)."""

    def __init__(self, dataset: Dataset, plan: GlobalBatch, *, shuffle: bool, seed: int, loss_reduction: str,
                 num_workers: int, pin_memory: bool, **loader_kwargs):
        self.dataset, self.plan, self.shuffle, self.seed = dataset, plan, shuffle, seed
        self.loss_reduction = loss_reduction
        self.epoch, self.steps_done = 0, 0
        self.optimizer: torch.optim.Optimizer | None = None
        self.weight: float | None = None          # the micro-batch in computation's share of its step
        self.backward_seen = False                 # a backward pass weighed since the last micro-batch was taken
        self.micro_batch_given = True
        self._exhausted: int | None = None          # the epoch whose steps this process iterated to the end
        self._resumed: tuple[int, int] | None = None   # (epoch, steps done) of the checkpoint just loaded
        self._open: GlobalStep | None = None       # the step being iterated
        self.batches = DataLoader(dataset, batch_sampler=_RankMicroBatches(self), num_workers=num_workers,
                                  pin_memory=pin_memory, persistent_workers=num_workers > 0, **loader_kwargs)

    # ---- position ---------------------------------------------------------------------
    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Start ``epoch`` (its own shuffle, the same on every rank) at step ``start_step``, on any world size."""
        if not 0 <= start_step <= self.plan.steps_per_epoch():
            raise UserError(f"start_step {start_step} is outside this epoch's 0..{self.plan.steps_per_epoch()} steps")
        resumed, self._resumed = self._resumed, None
        if resumed is not None and resumed[0] == epoch and resumed[1] != start_step:
            raise UserError(f"the checkpoint loaded stopped after step {resumed[1]} of epoch {epoch}, and "
                            f"set_epoch({epoch}, start_step={start_step}) would train the steps in between "
                            f"{'again' if start_step < resumed[1] else 'never'}: call loader.set_epoch({epoch}, "
                            f"start_step={resumed[1]}) (save loader.steps_done with the epoch)")
        self.epoch, self.steps_done, self._exhausted = epoch, start_step, None

    def __len__(self) -> int:
        """The steps left in this epoch."""
        return self.plan.steps_per_epoch() - self.steps_done

    def state_dict(self) -> dict:
        """Where the run stands (for a checkpoint's extra, or an elastic commit): the same on every rank."""
        return {"epoch": self.epoch, "steps_done": self.steps_done, "global_batch": self.plan.global_batch,
                "micro_batch": self.plan.micro_batch}

    def resumed(self, saved: dict | None) -> None:
        """Called by ``hk.load_checkpoint`` with the checkpoint's loader state: the next ``set_epoch`` is checked
        against it, and a checkpoint taken mid-epoch with another global batch is refused (its steps were others)."""
        if saved is None or "steps_done" not in saved:
            return
        theirs = GlobalBatch(saved["global_batch"], saved["micro_batch"], self.plan.samples, self.plan.drop_last)
        if 0 < saved["steps_done"] < theirs.steps_per_epoch():
            if (theirs.global_batch, theirs.micro_batch) != (self.plan.global_batch, self.plan.micro_batch):
                raise UserError(f"the checkpoint stopped after step {saved['steps_done']} of epoch {saved['epoch']} "
                                f"with global batch {theirs.global_batch} (micro-batch {theirs.micro_batch}), and this "
                                f"loader's is {self.plan.global_batch} ({self.plan.micro_batch}): finish the epoch "
                                "with the checkpoint's, and change it at an epoch's end")
            self._resumed = (saved["epoch"], saved["steps_done"])

    def load_state_dict(self, state: dict) -> None:
        """Go on from ``state`` (:meth:`state_dict`'s), on any world size, with the same global and micro-batch."""
        mine, theirs = (self.plan.global_batch, self.plan.micro_batch), (state["global_batch"], state["micro_batch"])
        if mine != theirs:
            raise UserError(f"this loader cuts steps of {mine[0]} into micro-batches of {mine[1]} and the state it "
                            f"should go on from was cut {theirs[0]} into {theirs[1]}: give the same global_batch and "
                            "micro_batch to hk.global_batch_loader everywhere")
        self._resumed = None
        self.set_epoch(state["epoch"], start_step=state["steps_done"])

    @property
    def steps_per_epoch(self) -> int:
        return self.plan.steps_per_epoch()

    def _order(self) -> list[int]:
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)       # DistributedSampler's order, as hk.distributed_loader's
        return torch.randperm(n, generator=g).tolist()

    @staticmethod
    def _rank() -> int:
        return context.backend(ADAPTER).rank()      # live: an elastic reset changes it

    @staticmethod
    def _size() -> int:
        return context.backend(ADAPTER).size()

    # ---- iteration --------------------------------------------------------------------------
    def __iter__(self):
        if self.optimizer is None:
            raise UserError("the global-batch loader has no optimizer: pass it to hk.DistributedOptimizer(optimizer, "
                            "model, global_batch=loader) before iterating it")
        if self._exhausted == self.epoch:
            raise UserError(f"epoch {self.epoch}'s steps were all taken: call loader.set_epoch(epoch) at the start of "
                            "each epoch (a new order, and its steps from the first)")
        batches = iter(self.batches)
        rank, size = self._rank(), self._size()
        for index in range(self.steps_done, self.plan.steps_per_epoch()):
            step = GlobalStep(self, index, batches, self.plan.share(index, rank, size))
            self._open = step
            yield step
            if not step.finished:
                raise UserError(f"step {index}'s micro-batches were not all taken (for x, y in step: ...) before the "
                                "next step: iterate each step to its end, or the ranks' gradients would not pair")
        self._open = None
        self._exhausted = self.epoch

    # ---- what the optimizer sees ----------------------------------------------------------------
    def bind(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
        """Called by DistributedOptimizer: weight each parameter's gradient, count the steps applied."""
        if self.optimizer is not None:
            raise UserError("this global-batch loader already drives an optimizer: make one loader per optimizer")
        self.optimizer = optimizer
        self._weighed = {id(p) for p in params if p.requires_grad}
        for p in params:
            if p.requires_grad:
                p.register_hook(self._weigh)
        optimizer.register_step_pre_hook(self._before_step)

    def _weigh(self, grad: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            if self._open is not None and self._open.started:
                raise UserError("backward() ran after a step's micro-batches were all taken: call loss.backward() "
                                "inside `for x, y in step:`, once per micro-batch (each is weighed as it is taken)")
            return grad
        self.backward_seen = True
        return grad * self.weight

    def check_weighed(self) -> None:
        """Every parameter that needs a gradient is weighed: one unfrozen (or added) since binding is not."""
        fresh = [p for g in self.optimizer.param_groups for p in g["params"]
                 if p.requires_grad and id(p) not in self._weighed]
        if fresh:
            raise UserError(f"{len(fresh)} parameter(s) need a gradient since DistributedOptimizer(global_batch=...) "
                            "wrapped the optimizer, and a fixed global batch weighs only those that needed one then: "
                            "unfreeze them before wrapping")

    def _before_step(self, optimizer, args, kwargs) -> None:
        step = self._open
        if step is not None and not step.finished:
            raise UserError(f"optimizer.step() was called before step {step.index}'s micro-batches were all taken: "
                            "call it once, after `for x, y in step:` ends (ranks take different numbers of "
                            "micro-batches, so a step inside that loop would not pair)")

    def _begin(self, step: GlobalStep) -> None:
        """Before a step's first micro-batch: Horovod reduces after this rank's last one (one reduction a step)."""
        opt = self.optimizer
        self.weight = None
        self.check_weighed()
        if hasattr(opt, "set_backward_passes_per_step"):
            opt.set_backward_passes_per_step(max(len(step.mine), 1))
        record = record_of(opt)
        if record is not None and record.average is not None:
            record.average.forget_step()         # nothing of this step is averaged yet, backward or not
        if record is not None and record.nonfinite is not None:
            record.nonfinite.expect_step()       # a rank with no micro-batch still joins the check

    def _end(self, step: GlobalStep) -> None:
        """After a step's last micro-batch: a rank that had none takes part in the sum now, so that its gradient,
        like the others', is the step's when the loop over micro-batches ends (clipping sees the same)."""
        self.weight = None
        self.steps_done = step.index + 1
        if not step.mine and self._size() > 1:
            self.optimizer.synchronize()


class GlobalStep:
    """One optimizer step: iterate it for this rank's micro-batches (see :func:`global_batch_loader`)."""

    def __init__(self, loader: GlobalBatchLoader, index: int, batches, mine: list[int]):
        self.loader, self.index, self._batches, self.mine = loader, index, batches, mine
        first, last = loader.plan.step_range(index)
        self.samples = last - first          # in the whole step, on all ranks together
        self.started = self.finished = False

    def __len__(self) -> int:
        """This rank's micro-batches in the step."""
        return len(self.mine)

    def __iter__(self):
        loader, plan = self.loader, self.loader.plan
        if self.finished or loader._open is not self:
            raise UserError(f"step {self.index} was already iterated: take each step's micro-batches once")
        loader._begin(self)
        self.started = True
        device = current().device
        for micro in self.mine:
            weight = plan.weight(self.index, micro)
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                # Seeded before the batch is read: a Dataset's own draws (num_workers=0) are the micro-batch's too.
                torch.manual_seed(plan.seed(loader.seed, loader.epoch, self.index, micro))
                batch = next(self._batches)
                loader.weight = weight if loader.loss_reduction == "mean" else 1.0 / self.samples
                loader.backward_seen = False
                yield batch
                if not loader.backward_seen:
                    loader.weight = None
                    raise UserError(f"micro-batch {micro} of step {self.index} got no backward() before the loop went "
                                    "on: call loss.backward() inside `for x, y in step:`, once per micro-batch (each "
                                    "is weighed and seeded as it is taken)")
        loader.weight = None
        self.finished = True
        loader._end(self)
