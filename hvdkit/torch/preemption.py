"""Preemption for PyTorch: checkpoint at the next step boundary when any rank is told to stop.

Example::

    guard = hk.PreemptionGuard()          # SIGTERM and SIGUSR1 are recorded, not fatal
    for epoch in range(start_epoch, epochs):
        train_loader.sampler.set_epoch(epoch, start_batch=start_batch)
        for batch, (x, y) in enumerate(train_loader, start=start_batch):
            ...                             # one ordinary step
            if guard.requested():           # one tiny allreduce; the same answer on every rank
                hk.save_checkpoint(path, model, optimizer, epoch=epoch, batch=batch + 1)
                guard.exit()                # exit code 75 (hvdkit.core.preemption.REQUEUE_EXIT_CODE)
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from hvdkit.core.preemption import DEFAULT_SIGNALS, REQUEUE_EXIT_CODE, Preemption
from hvdkit.torch._horovod import hvd
from hvdkit.torch.context import current


def PreemptionGuard(signals: Iterable[int] = DEFAULT_SIGNALS) -> Preemption:  # noqa: N802 (Horovod-style factory)
    """Record ``signals`` on this rank; ``guard.requested()`` agrees across ranks at a step boundary."""
    current()

    def any_rank(flag: int) -> int:
        return int(hvd.allreduce(torch.tensor([flag], dtype=torch.int32), op=hvd.Sum,
                                 name="hvdkit.preemption").item())

    return Preemption(any_rank, signals)


__all__ = ["PreemptionGuard", "REQUEUE_EXIT_CODE"]
