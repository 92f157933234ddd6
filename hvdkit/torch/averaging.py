"""Gradients averaged when ``backward()`` returns, as under DDP, for Horovod's optimizer; and the elastic reset.

:func:`hvdkit.torch.DistributedOptimizer` attaches an
:class:`AverageWhenBackwardReturns` to the optimizer it wraps, so a
``clip_grad_norm_`` between backward and step sees the average.
:func:`abandon_window` drops the step that was in flight when an elastic job reset.
"""

from __future__ import annotations

import logging
import time

import torch

from hvdkit.common.errors import UserError
from hvdkit.runtime.optimizer_record import OptimizerRecord, attach, op_of, record_of
from hvdkit.runtime.stragglers import core_wait_s
from hvdkit.torch.stragglers import CLOCK

log = logging.getLogger("hvdkit.torch")


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
    record = record_of(optimizer) or OptimizerRecord()
    for part in (record.average, record.nonfinite):
        if part is not None:
            part.forget_step()
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None


class AverageWhenBackwardReturns:
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
        attach(optimizer, average=self, accumulator_hooks=[lambda _p, accumulator: accumulator.register_hook(
            self._after_accumulation)])
        optimizer.synchronize = self.synchronize      # instance attribute: Horovod's step() calls it
        optimizer.register_step_post_hook(lambda *_: self.nested_done.clear())

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
        if record_of(opt).global_batch is not None:
            record_of(opt).global_batch.check_weighed()     # raises: its gradient of this pass went in unweighted
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
            for watch in record_of(opt).accumulator_hooks:
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
        if twice and op_of(self.optimizer) == "sum":
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
        started, core_at_start = time.perf_counter(), core_wait_s()
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
        CLOCK.add_wait(time.perf_counter() - started, core_s=core_wait_s() - core_at_start)
        CLOCK.step_done()
        # Horovod's step() warns when _synchronized is set (it expects skip_synchronize()); the
        # flag only means "averaged since the last step", which self.averaged now records.
        self.optimizer._synchronized = False
        self.averaged = True
