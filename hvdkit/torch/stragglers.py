"""The per-epoch straggler line for hvdkit.torch: the optimizer times each step, ``evaluate`` reports.

``hk.DistributedOptimizer`` feeds one process-wide :class:`~hvdkit.runtime.stragglers.StepClock`
(the wait is the time inside Horovod's synchronize, where a fast rank waits for
the slow one); ``hk.evaluate``, which a training loop already calls on every rank
once an epoch and which is a collective anyway, ends with :func:`report_stragglers`.
A loop that does not evaluate every epoch calls it itself::

    for epoch in range(epochs):
        for x, y in loader:
            ...
        hk.report_stragglers()      # every rank; rank 0 prints a line if one rank is slow
"""

from __future__ import annotations

from hvdkit.runtime import context
from hvdkit.runtime.stragglers import StepClock, Straggler, report_epoch, watch_for
from hvdkit.torch.context import ADAPTER, current

CLOCK = StepClock()


def report_stragglers() -> Straggler | None:
    """Compare the ranks' own step times since the last call (one small allgather); every rank calls it.

    Rank 0 prints ``hvdkit: rank R is a straggler, 2 epochs running: ...`` when one rank's
    step was twice the others' median or more at this call and the one before; every rank gets
    the :class:`Straggler` (or None).
    """
    ctx = current()
    steps, busy_s = CLOCK.take()
    return report_epoch(context.backend(ADAPTER), steps, busy_s, rank=ctx.rank, size=ctx.size, watch=watch_for(ctx))
