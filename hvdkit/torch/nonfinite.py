"""The torch side of :mod:`hvdkit.runtime.nonfinite`: a NaN or inf gradient stops the step and names its rank.

Installed by :func:`hvdkit.torch.DistributedOptimizer` unless
``check_finite=False``. Each gradient's own contribution is summed (one
reduction a parameter and backward pass, no host sync) just before autograd
accumulates it, that is before Horovod's allreduce overwrites it with the
average; before the optimizer steps, one fused norm over the averaged
gradients and one host sync tell whether anything is non-finite. Only then
do the ranks gather their own sums. A ``GradScaler`` skips steps with inf
gradients before calling ``step()``, so mixed precision is not stopped.
"""

from __future__ import annotations

import torch

from hvdkit.runtime import context
from hvdkit.runtime.nonfinite import NonFiniteGradientError, nonfinite_message
from hvdkit.runtime.optimizer_record import attach
from hvdkit.torch.context import ADAPTER, current


class NonFiniteCheck:
    """Before each ``step()``: raise :class:`NonFiniteGradientError` on every rank if the average is not finite."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.names = optimizer._parameter_names
        self.own: list[tuple[torch.Tensor, torch.Tensor]] = []   # (parameter, sum of its gradient), this step
        self.steps = 0
        self.armed = False        # a step is due although this rank computed no gradient (a fixed global batch)
        # Horovod's accumulators, in its order: param_groups' parameters that require a gradient.
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        for p, accumulator in zip(params, optimizer._grad_accs):
            self.watch(p, accumulator)
        record = attach(optimizer, nonfinite=self)
        record.accumulator_hooks.append(self.watch)     # parameters hvdkit.torch.averaging hooks later
        optimizer.register_step_pre_hook(self._before_step)

    def forget_step(self) -> None:
        """The step in flight was dropped (an elastic reset): its gradient sums go with it."""
        self.own.clear()
        self.armed = False

    def expect_step(self) -> None:
        """The next ``step()`` checks even with no gradient of this rank's own: a global-batch step this rank
        took no micro-batch of still sums the others', and joins the gather when they are not finite."""
        self.armed = True

    def watch(self, p: torch.Tensor, accumulator) -> None:
        accumulator.register_prehook(self._before_accumulation(p))

    def _before_accumulation(self, p: torch.Tensor):
        def hook(grad_outputs):
            grad = grad_outputs[0]
            if grad is not None and not grad.is_sparse:
                self.own.append((p, grad.detach().sum()))
        return hook

    def _before_step(self, optimizer, args, kwargs) -> None:
        # torch runs step pre-hooks twice under Horovod's class (its step and the original's): once is enough.
        if not self.own and not self.armed:
            return
        # (A step a GradScaler skipped leaves them to the next: a stale name at worst.)
        own, self.own, self.armed = self.own, [], False
        self.steps += 1
        optimizer.synchronize()           # a no-op when backward() already averaged (hvdkit.torch.optimizer)
        # Only what was averaged, so every rank sees the same values and takes the same branch.
        averaged = optimizer._requires_update
        grads = [p.grad for g in optimizer.param_groups for p in g["params"]
                 if p in averaged and p.requires_grad and p.grad is not None and not p.grad.is_sparse]
        if not grads or _all_finite(grads):
            return
        first = next((self.names.get(p, "?") for p, total in own if not bool(torch.isfinite(total))), None)
        gathered = context.backend(ADAPTER).allgather_object(first, name="hvdkit.nonfinite")
        bad = [(rank, name) for rank, name in enumerate(gathered) if name is not None]
        raise NonFiniteGradientError(nonfinite_message(bad, step=self.steps, size=current().size))


def _all_finite(grads: list[torch.Tensor]) -> bool:
    """One fused norm a dtype, one host sync: NaN and inf make the norm non-finite."""
    low = [g for g in grads if g.is_floating_point() and g.element_size() < 4]
    rest = [g for g in grads if not (g.is_floating_point() and g.element_size() < 4)]
    # Low precision in float32: a float16 gradient's norm overflows float16 long before its elements do.
    norms = [n.float() for n in torch._foreach_norm(rest)] if rest else []
    norms += list(torch._foreach_norm(low, 2, dtype=torch.float32)) if low else []
    return bool(torch.stack(norms).isfinite().all())
