"""Steps 3-5: wrap the optimizer, broadcast the initial state, scale the learning rate.

Example::

    optimizer = torch.optim.SGD(model.parameters(), lr=hk.scale_lr(0.01), momentum=0.9)
    optimizer = hk.DistributedOptimizer(optimizer, model)
    hk.broadcast_state(model, optimizer)
    scheduler = hk.warmup_scheduler(optimizer, warmup_steps=len(loader) * 5)
"""

from __future__ import annotations

import logging

import torch

import hvdkit.torch.sharded as sharded
from hvdkit.backends.torch import hvd
from hvdkit.common.errors import UserError
from hvdkit.runtime import async_save, context, state, topology
from hvdkit.runtime.lr import job_reduce_options, scale_lr_for
from hvdkit.runtime.lr import warmup_steps as count_warmup_steps
from hvdkit.runtime.optimizer_record import OptimizerRecord, attach, global_batch_of, record_of
from hvdkit.torch.averaging import AverageWhenBackwardReturns
from hvdkit.torch.context import ADAPTER, current
from hvdkit.torch.data import check_loader_sharded
from hvdkit.torch.elastic import register_sharded_handler
from hvdkit.torch.nonfinite import NonFiniteCheck
from hvdkit.torch.tensors import plain_module, to_cpu

log = logging.getLogger("hvdkit.torch")


def _is_wrapped(optimizer: torch.optim.Optimizer) -> bool:
    # Horovod makes a new class with the original's name (e.g. "SGD") whose
    # methods come from horovod.torch.optimizer; look for those.
    return type(optimizer).__module__.startswith("horovod.") or hasattr(optimizer, "skip_synchronize")


def DistributedOptimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module, *,
                         compression: str = "none", backward_passes_per_step: int = 1,
                         op: str = "average", gradient_predivide_factor: float = 1.0,
                         sparse_as_dense: bool = False, check_finite: bool = True,
                         shard_optimizer_state: bool = False, global_batch=None) -> torch.optim.Optimizer:
    """Step 3: average gradients across ranks with Horovod's ring-allreduce.

    ``model`` supplies parameter names (so Horovod's tensor names match on all
    ranks) and is checked against the optimizer: every parameter the
    optimizer updates must belong to it and sit on this rank's device.
    ``backward_passes_per_step=k`` accumulates k local backward passes before
    one allreduce (gradient accumulation). ``compression="fp16"`` halves the
    bytes on the wire. ``check_finite`` (on by default) stops a step whose
    averaged gradient holds NaN or inf before it is applied, naming the rank
    that produced it (:mod:`hvdkit.torch.nonfinite`; its cost is in
    docs/RELIABILITY.md). ``shard_optimizer_state=True`` keeps 1/N of the
    optimizer state on each rank (ZeRO stage 1, :mod:`hvdkit.torch.sharded`):
    gradients are averaged as before, each rank updates its slice of every
    parameter, and the slices are all-gathered after ``step()``.
    ``global_batch=loader`` (an :func:`hvdkit.torch.global_batch_loader`)
    makes each step the mean over that loader's fixed global batch, whatever
    the number of ranks (:mod:`hvdkit.torch.global_batch`): the rate is then
    the global batch's own, not ``scale_lr``'s.
    """
    ctx = current()
    if _is_wrapped(optimizer):
        raise UserError("optimizer is already a Horovod DistributedOptimizer: wrap the plain torch optimizer once")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UserError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}: "
                        "create the optimizer first, then pass it to DistributedOptimizer(optimizer, model)")
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"the second argument must be the model (torch.nn.Module), got {type(model).__name__}: "
                        "call DistributedOptimizer(optimizer, model)")
    model = plain_module(model)             # the same names whether compiled or not
    backend = context.backend(ADAPTER)
    op, compression = job_reduce_options(backend, ctx.size, op, compression)
    if backward_passes_per_step < 1:
        raise UserError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if global_batch is not None:
        op = _check_global_batch(global_batch, op, backward_passes_per_step)
        synced = [n for n, m in model.named_modules() if isinstance(m, (hvd.SyncBatchNorm, torch.nn.SyncBatchNorm))]
        if synced:
            raise UserError(f"{synced[0]!r} is a SyncBatchNorm, which gathers statistics from every rank at each "
                            "forward, and with a fixed global batch ranks take different numbers of micro-batches, "
                            "so those gathers would not pair: use torch.nn.BatchNorm (docs/GLOBAL_BATCH.md)")
    if shard_optimizer_state:
        sharded.check_supported(type(optimizer))
    if shard_optimizer_state and op == "adasum":
        raise UserError("shard_optimizer_state works with op='average' or 'sum': Adasum combines whole updates, "
                        "not gradients, so there is no average to update a slice from")

    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in names:
                raise UserError(
                    f"the optimizer updates a parameter of shape {tuple(p.shape)} that is not in the model: "
                    "build the optimizer from this model's parameters (after model.to(device)) and pass the same model"
                )
            if p.device.type != ctx.device.type or (p.device.index or 0) != (ctx.device.index or 0):
                raise UserError(
                    f"parameter {names[id(p)]!r} is on {p.device} but this rank's device is {ctx.device}: "
                    "call model.to(ctx.device) before creating the optimizer"
                )
    wrapped = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=backend.compression(compression),
        backward_passes_per_step=backward_passes_per_step,
        op=backend.reduce_op(op),
        gradient_predivide_factor=gradient_predivide_factor,
        sparse_as_dense=sparse_as_dense,
    )
    attach(wrapped, op=op)         # the learning rate's scaling rule, for a checkpoint resumed on another size
    # Horovod builds its optimizer from param_groups alone, so its defaults are the class's (Adam's lr=1e-3, no
    # momentum or weight decay), not the ones the script gave: a group added later (add_param_group, as
    # Lightning's BaseFinetuning unfreezes) silently took those. Keep the script's.
    wrapped.defaults = dict(optimizer.defaults)
    type(wrapped).zero_grad = _zero_grad      # Horovod's class only: it made this class for this optimizer alone
    # Horovod builds a new optimizer from param_groups, which drops any state
    # the original already had (momentum, Adam moments, e.g. loaded before
    # wrapping). Carry it over.
    if optimizer.state:
        wrapped.load_state_dict(optimizer.state_dict())
    if op != "adasum":      # Adasum combines weight changes in step(): there is no gradient average to wait for
        AverageWhenBackwardReturns(wrapped)
        if check_finite and wrapped._grad_accs:   # none at size 1: nothing to spread
            NonFiniteCheck(wrapped)
    else:
        _mark_adasum_local_steps(wrapped)
    # One process shards nothing, unless it is an elastic job's, which may grow.
    if shard_optimizer_state and (ctx.size > 1 or topology.is_elastic()):
        sharded.shard(wrapped, ctx.rank, ctx.size)
        register_sharded_handler()      # an elastic state, hvdkit's or Horovod's, commits the whole state
    if global_batch is not None:
        attach(wrapped, global_batch=global_batch)
        global_batch.bind(wrapped, [p for g in wrapped.param_groups for p in g["params"]])
    check_weights_at_first_step(wrapped)   # a forgotten broadcast_state: ranks that started apart
    # A background save (save_checkpoint(..., blocking=False)) that failed is raised at the step after.
    wrapped.register_step_pre_hook(lambda opt, args, kwargs: async_save.check())
    return wrapped


def _check_global_batch(loader, op: str, backward_passes_per_step: int) -> str:
    """The op a global-batch optimizer reduces with: a sum of the micro-batches' weighted gradients."""
    from hvdkit.torch.global_batch import GlobalBatchLoader

    if not isinstance(loader, GlobalBatchLoader):
        raise UserError(f"global_batch takes the loader made by hk.global_batch_loader(), got {type(loader).__name__}:"
                        " build it with hk.global_batch_loader(dataset, global_batch=...)")
    if op != "average":
        raise UserError(f"global_batch sums each micro-batch's weighted gradient into the step's mean, so op={op!r} "
                        "has no place: leave op at its default")
    if backward_passes_per_step != 1:
        raise UserError("global_batch decides how many backward passes a rank takes each step: leave "
                        "backward_passes_per_step at 1 and give micro_batch to hk.global_batch_loader instead")
    if context.scales_lr():
        raise UserError("hk.scale_lr multiplies the rate by the number of ranks, but with a fixed global batch the "
                        "rate does not depend on them: pass the rate for the global batch itself "
                        "(lr=0.1, not hk.scale_lr(0.1))")
    return "sum"


def _zero_grad(self, set_to_none: bool = True) -> None:
    """Horovod's zero_grad, with torch's ``set_to_none`` (Horovod's takes no argument: a TypeError)."""
    record = record_of(self)
    if record is not None and record.average is not None:
        record.average.nested_done.clear()      # a new window, even after a backward that raised
    if self._handles:
        raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                             "or optimizer.synchronize(): that races with the allreduces in flight")
    type(self).__bases__[0].zero_grad(self, set_to_none=set_to_none)


def _mark_adasum_local_steps(optimizer: torch.optim.Optimizer) -> None:
    """Tell step hooks Adasum's local steps from the step a script calls.

    Horovod's Adasum steps the wrapped optimizer once per parameter, from its gradient hook during backward
    (and from ``step()`` for parameters without one), to take that rank's own change, and combines the changes
    in ``step()``. Torch runs the optimizer's step hooks on those local steps too: the first-step weights check
    then compared each rank's own update and stopped every Adasum job at step 1, blaming the broadcast.
    The record's ``local_step`` is True while one runs. Parameters that need a gradient only after wrapping
    would never be combined (Horovod hooks what required one then): the script's step stops, naming them."""
    local = optimizer._allreduce_grad_async
    record = attach(optimizer, local_step=False)

    def local_step(p):
        record.local_step = True
        try:
            return local(p)
        finally:
            record.local_step = False

    def before_step(opt, args, kwargs):
        if record.local_step or not opt._grad_accs:     # none at size 1: nothing is combined
            return
        unhooked = [opt._parameter_names.get(p, "an unnamed parameter") for g in opt.param_groups
                    for p in g["params"] if p.requires_grad and p not in opt._requires_update]
        if unhooked:
            raise UserError(f"{len(unhooked)} parameter(s) need a gradient since DistributedOptimizer(op='adasum') "
                            f"wrapped the optimizer ({', '.join(sorted(unhooked)[:3])}), and Adasum combines only "
                            "those it hooked then, so each rank would keep its own: unfreeze them before wrapping, "
                            "or use op='average'")

    optimizer._allreduce_grad_async = local_step
    optimizer.register_step_pre_hook(before_step)


BROADCAST_FIX = "call hk.broadcast_state(model, optimizer) after DistributedOptimizer, before the first step"


def check_weights_at_first_step(optimizer: torch.optim.Optimizer) -> None:
    """Once, after the optimizer's first ``step()``: raise on every rank if the ranks' parameters differ.

    Averaged gradients keep equal weights equal, so ranks that differ after
    step 1 started apart (``hk.init(seed)`` seeds each rank differently) and
    would stay apart for the whole run: an error, not a warning, since no
    job wants that. One float64 digest per rank, gathered once
    (:func:`hvdkit.runtime.state.check_weights_agree`).
    """
    if not state.weights_check_applies(current().size):
        return

    done = []

    def after_step(opt, args, kwargs):
        # Torch runs post-hooks twice per step under Horovod (its class and the original's step are both
        # hooked), and removing a hook while they run breaks a user's own post-hook: a flag, not remove().
        if done or (record_of(opt) or OptimizerRecord()).local_step:    # Adasum's per-parameter local steps: not yet
            return
        done.append(True)
        # A generator: one parameter at a time on the host, no float64 copy of the whole model.
        params = (p.detach().double().cpu().numpy() for g in opt.param_groups for p in g["params"])
        state.check_weights_agree(context.backend(ADAPTER), state.weights_digest(params), BROADCAST_FIX)
        check_loader_sharded()      # the loader in use: a plain DataLoader trains every rank on all the data

    optimizer.register_step_post_hook(after_step)


def broadcast_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    root_rank: int = 0) -> None:
    """Step 4: copy rank 0's parameters, buffers and optimizer state to every rank.

    The model's ``state_dict`` tensors go by name through
    :func:`hvdkit.runtime.state.broadcast_state`, which first checks that every
    rank holds the same names and shapes. Buffers matter (BatchNorm running
    statistics are not parameters). The optimizer state goes as one object:
    Horovod's own broadcast_optimizer_state initialises an empty state by
    running a zero-gradient step(), which advances Adam's step counter and
    applies weight decay, so the first real step would differ from a
    single-process run.
    """
    backend = context.backend(ADAPTER)
    named = [(n, t) for n, t in plain_module(model).state_dict().items() if torch.is_tensor(t)]
    state.broadcast_state(backend, named, root_rank, what="model")   # in place: state_dict shares storage
    if optimizer is None:
        return
    rank = current().rank
    if sharded.is_sharded(optimizer):                   # every rank sends its slices to the root
        opt_state = sharded.gathered_state(optimizer, root_rank, "hk.broadcast_state")
    else:
        opt_state = optimizer.state_dict() if rank == root_rank else None
    opt_state = backend.broadcast_object(to_cpu(opt_state) if rank == root_rank else None, root_rank,
                                         name="hvdkit.optimizer_state")
    if rank != root_rank and sharded.is_sharded(optimizer):
        record_of(optimizer).slices.load_state_dict(opt_state)     # not the script's own load (Slices.user_loads)
    elif rank != root_rank:
        optimizer.load_state_dict(opt_state)


def scale_lr(base_lr: float, op: str = "average") -> float:
    """Step 5: the single-worker ``base_lr`` scaled for this job (times size; :func:`hvdkit.runtime.lr.scale_lr`)."""
    return scale_lr_for(base_lr, current(), op)


def warmup_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int | None = None, *,
                     warmup_epochs: float | None = None,
                     steps_per_epoch: int | None = None) -> torch.optim.lr_scheduler.LinearLR:
    """Per-batch gradual warmup to the optimizer's (already scaled) rate, from that rate / size.

    Give the length in steps, or in epochs with ``steps_per_epoch`` (e.g.
    ``len(train_loader)``), as for :func:`hvdkit.keras.callbacks`.
    Call ``scheduler.step()`` after every ``optimizer.step()``.

    It is torch's ``LinearLR(start_factor=1/size, total_iters=steps)``, which
    multiplies the rate the optimizer holds at each step rather than setting
    it, so it composes: a manual ``group["lr"] /= 4`` is kept, and your own
    schedule goes beside it (step each at its own pace) or in a
    ``ChainedScheduler``::

        warmup = hk.warmup_scheduler(optimizer, warmup_epochs=2, steps_per_epoch=len(loader))
        decay = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
        # warmup.step() after every batch, decay.step() after every epoch
    """
    if global_batch_of(optimizer) is not None:
        raise UserError("warmup_scheduler ramps up from rate / size, which changes with the number of ranks, and a "
                        "fixed global batch keeps one rate at any size: for a warmup of your own use "
                        "torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=steps)")
    total = count_warmup_steps(warmup_steps, warmup_epochs, steps_per_epoch)
    start = 1.0 / current().size if total else 1.0
    return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=start, end_factor=1.0,
                                             total_iters=max(total, 1))


def step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, *, scaler=None,
         max_grad_norm: float | None = None) -> None:
    """backward + (unscale, clip) + step: the AMP one-liner.

    Gradients are averaged when ``backward()`` returns (see
    :class:`~hvdkit.torch.averaging.AverageWhenBackwardReturns`), so this is the single-process
    recipe unchanged::

        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        scaler.step(optimizer)
        scaler.update()

    Intended for ``backward_passes_per_step=1``; with accumulation, call
    ``loss.backward()`` per micro-batch and ``optimizer.step()`` yourself.
    """
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if scaler is not None:
        scaler.unscale_(optimizer)
    if max_grad_norm is not None:
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
