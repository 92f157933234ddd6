"""Steps 3-5: wrap the optimizer, broadcast the initial state, scale the learning rate.

Example::

    optimizer = torch.optim.SGD(model.parameters(), lr=hk.scale_lr(0.01), momentum=0.9)
    optimizer = hk.DistributedOptimizer(optimizer, model)
    hk.broadcast_state(model, optimizer)
    scheduler = hk.warmup_scheduler(optimizer, warmup_steps=len(loader) * 5)
"""

from __future__ import annotations

import logging
import time

import torch

import hvdkit.torch.sharded as sharded
from hvdkit.backends.torch import hvd
from hvdkit.common.errors import UserError
from hvdkit.runtime import context, state, topology
from hvdkit.runtime.lr import job_reduce_options, scale_lr_for
from hvdkit.runtime.lr import warmup_steps as count_warmup_steps
from hvdkit.torch.context import ADAPTER, current
from hvdkit.torch.data import check_loader_sharded
from hvdkit.torch.nonfinite import NonFiniteCheck
from hvdkit.torch.stragglers import CLOCK
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
                         shard_optimizer_state: bool = False) -> torch.optim.Optimizer:
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
    wrapped._hvdkit_op = op        # the learning rate's scaling rule, for a checkpoint resumed on another size
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
        _AverageWhenBackwardReturns(wrapped)
        if check_finite and wrapped._grad_accs:   # none at size 1: nothing to spread
            NonFiniteCheck(wrapped)
    else:
        _mark_adasum_local_steps(wrapped)
    # One process shards nothing, unless it is an elastic job's, which may grow.
    if shard_optimizer_state and (ctx.size > 1 or topology.is_elastic()):
        sharded.shard(wrapped, ctx.rank, ctx.size)
    check_weights_after_first_step(wrapped)   # a forgotten broadcast_state: ranks that started apart
    return wrapped


def _zero_grad(self, set_to_none: bool = True) -> None:
    """Horovod's zero_grad, with torch's ``set_to_none`` (Horovod's takes no argument: a TypeError)."""
    if getattr(self, "_hvdkit_average", None) is not None:
        self._hvdkit_average.nested_done.clear()      # a new window, even after a backward that raised
    if self._handles:
        raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                             "or optimizer.synchronize(): that races with the allreduces in flight")
    type(self).__bases__[0].zero_grad(self, set_to_none=set_to_none)


def abandon_window(optimizer: torch.optim.Optimizer) -> None:
    """After an elastic reset: forget the step that was in flight, so the next one starts a window afresh.

    A lost rank fails the collective a step waits in (the allreduces of backward or ``step()``), and the
    step's state stays behind. Horovod's restore loads the commit with its ``load_state_dict``, which clears
    the handles and the count of accumulated passes but not ``.grad``: a loop that zeroes gradients after
    ``step()`` (the usual accumulation loop) added the dropped step's into the next. A sharded optimizer's
    restore re-cuts the slices without it, so its handles (from the Horovod the reset shut down) stayed too,
    and the first ``zero_grad()`` raised "zero_grad() was called after loss.backward() but before
    optimizer.step()", ending the job. The restored state is a commit, taken between steps: the gradients of
    the step in flight are dropped with it, as one process restarted from the commit would not have them."""
    if not hasattr(optimizer, "_handles"):
        return
    optimizer._handles.clear()
    for p in optimizer._allreduce_delay:
        optimizer._allreduce_delay[p] = optimizer.backward_passes_per_step
    for group in getattr(optimizer, "_group_counts", {}) or {}:
        optimizer._group_counts[group] = 0
    optimizer._synchronized = False
    optimizer._should_synchronize = True
    for part in (getattr(optimizer, "_hvdkit_average", None), getattr(optimizer, "_hvdkit_nonfinite", None)):
        if part is not None:
            part.forget_step()
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None


class _AverageWhenBackwardReturns:
    """DDP's guarantee for Horovod's optimizer: gradients are averaged when ``backward()`` returns.

    Horovod starts each gradient's allreduce from a hook as soon as autograd
    has accumulated it (the overlap with the rest of backward), but waits for
    the results only in ``step()``. Anything between backward and step (a
    ``clip_grad_norm_``, a gradient norm logged, a hand-written update) then
    sees this rank's own gradients, not the average, and nothing says so.
    Here a second hook on each gradient accumulator queues an autograd
    end-of-backward callback once per backward pass (graph task), as DDP's
    reducer does, which waits for the allreduces once every parameter's has
    started. With ``backward_passes_per_step=k`` the first k-1 passes start
    none, so they stay local, as under DDP's ``no_sync()``. ``synchronize()``
    and ``step()`` then find nothing left to wait for.

    Parameters that get no gradient in a pass (unused, or frozen by hand
    while still ``requires_grad``) are averaged as zeros, as Horovod does,
    when the outermost backward pass ends, with a one-time warning that names
    them (one process would leave them alone). Parameters frozen with ``requires_grad=False`` after the optimizer
    was wrapped are left out of the averaging, as DDP leaves them: Horovod
    would give them a zero gradient, which momentum and weight decay then
    turn into a move; untouched, their ``grad`` stays None and the optimizer
    skips them, as in one process. Every rank must freeze the same ones
    (each rank's set decides which allreduces it joins). Parameters that
    need a gradient only after wrapping (unfrozen, or added with
    ``add_param_group``) are hooked at the end of the first backward pass
    that finds them, and averaged from that pass on. Keying on the
    graph task, not a flag, means a backward that raised (a caught
    out-of-memory error, an elastic reset) cannot leave the callback off; and
    reentrant activation checkpointing, whose inner backward passes are
    graph tasks of their own, waits only after the last parameter's gradient.
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.horovod_synchronize = type(optimizer).synchronize
        self.task = None                             # the graph task a callback was last queued on
        self.averaged = False
        # Averaged at the end of a reentrant checkpoint's inner pass, inside the outer one: the outer pass's end
        # counts them as averaged (a weight used inside the checkpoint and outside it gets a second allreduce).
        self.nested_done: set = set()
        self.warned = False
        self.hooked = bool(optimizer._grad_accs)     # Horovod registers no hooks at size 1 (unless elastic)
        for accumulator in optimizer._grad_accs:
            accumulator.register_hook(self._after_accumulation)
        # What else watches a gradient accumulator (the non-finite check), for parameters hooked later.
        optimizer._hvdkit_accumulator_hooks = [lambda _p, accumulator: accumulator.register_hook(
            self._after_accumulation)]
        optimizer.synchronize = self.synchronize      # instance attribute: Horovod's step() calls it
        optimizer.register_step_post_hook(lambda *_: self.nested_done.clear())
        optimizer._hvdkit_average = self

    def forget_step(self) -> None:
        """The step in flight was dropped (an elastic reset): no pass of it has been averaged."""
        self.task, self.averaged = None, False
        self.nested_done.clear()

    def _after_accumulation(self, *_):
        # Runs after Horovod's hook on the same accumulator, so its allreduce has started.
        task = torch._C._current_graph_task_id()
        if task != self.task:
            self.task, self.averaged = task, False
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

    def _averaged_now(self) -> set:
        """The parameters this step averages: Horovod's list, less those frozen (requires_grad=False) since,
        unless they got a gradient earlier in this window (frozen between two of its passes: one process
        applies that gradient, so the ranks must apply its average)."""
        handles = self.optimizer._handles
        return {p for p in self.optimizer._requires_update if p.requires_grad or p in handles}

    def _not_started(self) -> list:
        """Parameters to average whose allreduce has not started (no gradient in this pass yet)."""
        handles = self.optimizer._handles
        return [p for p in self._averaged_now() if handles.get(p, (None, None))[0] is None
                and not (p in self.nested_done and p not in handles)]

    def _started(self) -> bool:
        """Every parameter's allreduce has started (the k-th of k accumulated passes has reached them all)."""
        return not self._not_started()

    def _end_of_backward(self) -> None:
        self.task = None
        self._hook_new_parameters()
        outermost = torch._C._current_autograd_node() is None   # a reentrant checkpoint's inner passes run in a node
        if self._started():
            self.synchronize()
            if not outermost:
                self.nested_done |= self._averaged_now()
        elif outermost and self._window_over():
            # The outermost pass ended a window with some parameters given no gradient (unused): the others'
            # allreduces write into .grad in place, so a clip_grad_norm_ before step() raced with them (results
            # changed from run to run). Average now.
            self.synchronize()
        if outermost:
            self.nested_done.clear()

    def _window_over(self) -> bool:
        """An allreduce started in this window: the backward_passes_per_step-th pass has run."""
        return any(handle is not None for handle, _ in self.optimizer._handles.values())

    def _hook_new_parameters(self) -> list:
        """Average parameters that need a gradient since wrapping: given requires_grad=True, or add_param_group.

        Horovod hooks only the parameters that required a gradient when it wrapped the optimizer, and
        averages only those; a layer unfrozen later (gradual unfreezing, Lightning's BaseFinetuning) kept
        each rank's own gradient, and the ranks' weights drifted apart, silently. Each one found here (every
        rank finds the same ones, in the same order: hvdkit's rule for freezing) gets Horovod's hook and
        hvdkit's for the passes to come, and the pass that just ran is counted as the hook would have."""
        if not self.hooked:
            return []
        opt = self.optimizer
        fresh = [(gi, pi, p) for gi, g in enumerate(opt.param_groups) for pi, p in enumerate(g["params"])
                 if p.requires_grad and p not in opt._requires_update]
        if not fresh:
            return []
        # Where the others stand in the window of backward_passes_per_step passes (the fewest passes left):
        # unfrozen between two of its passes, a parameter's allreduce starts with theirs, not one window later.
        left = min((opt._allreduce_delay[q] for q in self._averaged_now() if q in opt._handles),
                   default=opt.backward_passes_per_step - 1)
        for gi, pi, p in fresh:
            opt._parameter_names.setdefault(p, f"hvdkit.added.{gi}.{pi}")    # added with a group, unnamed
            opt._allreduce_delay[p] = opt.backward_passes_per_step
            if opt._groups is not None:              # grouped allreduce: a group of its own
                opt._p_to_group[p] = (p,)
                opt._group_counts[(p,)] = 0
            opt._requires_update.add(p)
            with torch.enable_grad():                 # autograd's end-of-backward callbacks run without it
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            hook = opt._make_hook(p)
            accumulator.register_hook(hook)
            opt._grad_accs.append(accumulator)        # Horovod's list keeps the accumulator alive
            for watch in opt._hvdkit_accumulator_hooks:
                watch(p, accumulator)
            if p.grad is not None:                    # this pass's gradient, accumulated before the hook
                opt._allreduce_delay[p] = left + 1
                hook()
        return [p for _, _, p in fresh]

    def synchronize(self) -> None:
        """Wait for the allreduces; a no-op when the last backward pass already did."""
        fresh = self._hook_new_parameters()
        if self.averaged and not self.optimizer._handles:
            return
        handles = self.optimizer._handles
        twice = [p for p in self.nested_done if p in handles]
        if twice and getattr(self.optimizer, "_hvdkit_op", "average") == "sum":
            # Its gradient, already summed at the inner pass's end, would be summed again with the rest: N times it.
            raise UserError(f"{self.optimizer._parameter_names.get(twice[0], 'a parameter')!r} got gradients in a "
                            "reentrant activation checkpoint's backward and outside it, which op='sum' would add up "
                            "size times: use op='average', or torch.utils.checkpoint(..., use_reentrant=False)")
        missing = [p for p in self._not_started() if p not in handles]   # no gradient in any pass of the window
        if missing and not self.warned and any(h is not None for h, _ in handles.values()):
            self.warned = True      # a pass started allreduces but not all of them: some parameters got no gradient
            names = sorted(self.optimizer._parameter_names[p] for p in missing)
            log.warning("hvdkit: %d parameter(s) got no gradient in the last backward pass (%s%s), so Horovod "
                        "averages a zero gradient for them, which momentum and weight decay turn into a move (one "
                        "process leaves them alone); set requires_grad=False on parameters that are not used",
                        len(names), ", ".join(names[:3]), ", ..." if len(names) > 3 else "")
        started = time.perf_counter()
        everything = self.optimizer._requires_update
        # Frozen since wrapping and not started: Horovod's synchronize would reduce a zero gradient for them.
        frozen = {p for p in everything - self._averaged_now()
                  if self.optimizer._handles.get(p, (None, None))[0] is None}
        for p in frozen:
            self.optimizer._handles.pop(p, None)
        # Averaged when the last backward returned, but for parameters hooked only now: those alone are left.
        # Averaged at a reentrant checkpoint's inner end: only those with a gradient since (in handles) are left.
        left = set(fresh) if self.averaged else everything - (self.nested_done - set(handles))
        self.optimizer._requires_update = left - frozen
        try:
            self.horovod_synchronize(self.optimizer)
        finally:
            self.optimizer._requires_update = everything
        # The wait for the other ranks' gradients: a step less it is this rank's own (hk.report_stragglers).
        CLOCK.add_wait(time.perf_counter() - started)
        CLOCK.step_done()
        # Horovod's step() warns when _synchronized is set (it expects skip_synchronize()); the
        # flag only means "averaged since the last step", which self.averaged now records.
        self.optimizer._synchronized = False
        self.averaged = True


def _mark_adasum_local_steps(optimizer: torch.optim.Optimizer) -> None:
    """Tell step hooks Adasum's local steps from the step a script calls.

    Horovod's Adasum steps the wrapped optimizer once per parameter, from its gradient hook during backward
    (and from ``step()`` for parameters without one), to take that rank's own change, and combines the changes
    in ``step()``. Torch runs the optimizer's step hooks on those local steps too: the first-step weights check
    then compared each rank's own update and stopped every Adasum job at step 1, blaming the broadcast.
    ``optimizer._hvdkit_local_step`` is True while one runs. Parameters that need a gradient only after wrapping
    would never be combined (Horovod hooks what required one then): the script's step stops, naming them."""
    local = optimizer._allreduce_grad_async
    optimizer._hvdkit_local_step = False

    def local_step(p):
        optimizer._hvdkit_local_step = True
        try:
            return local(p)
        finally:
            optimizer._hvdkit_local_step = False

    def before_step(opt, args, kwargs):
        if opt._hvdkit_local_step or not opt._grad_accs:     # none at size 1: nothing is combined
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


def check_weights_after_first_step(optimizer: torch.optim.Optimizer) -> None:
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
        if done or getattr(opt, "_hvdkit_local_step", False):    # Adasum's per-parameter local steps: not yet
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
        optimizer._hvdkit_shards.load_state_dict(opt_state)     # not the script's own load (Shards.user_loads)
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
    total = count_warmup_steps(warmup_steps, warmup_epochs, steps_per_epoch)
    start = 1.0 / current().size if total else 1.0
    return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=start, end_factor=1.0,
                                             total_iters=max(total, 1))


def step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, *, scaler=None,
         max_grad_norm: float | None = None) -> None:
    """backward + (unscale, clip) + step: the AMP one-liner.

    Gradients are averaged when ``backward()`` returns (see
    :class:`_AverageWhenBackwardReturns`), so this is the single-process
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
