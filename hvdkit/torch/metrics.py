"""torchmetrics over every rank: its state gathered through Horovod, since Horovod jobs have no torch.distributed.

torchmetrics syncs a metric's state in ``compute()`` only when ``torch.distributed``
is initialised, which a Horovod job never does: each rank's result silently
covers its own shard. :func:`torchmetrics_sync` gives a metric the two hooks
torchmetrics takes for another collective library::

    accuracy = torchmetrics.classification.BinaryAccuracy(**hk.torchmetrics_sync())
    for x, y in val_loader:                     # each rank its own rows, no padding (hk.eval_loader)
        accuracy.update(model(x).squeeze(1), y)
    accuracy.compute()                          # every rank: the whole validation set's accuracy
"""

from __future__ import annotations

import itertools

import torch

from hvdkit.runtime import context
from hvdkit.torch.context import ADAPTER, current

_calls = itertools.count()


def _gather(tensor: torch.Tensor, group=None) -> list[torch.Tensor]:
    """One tensor from every rank, in rank order, on ``tensor``'s device; ranks may differ in shape."""
    parts = context.backend(ADAPTER).allgather_object(tensor.detach().cpu(),
                                                      name=f"hvdkit.torchmetrics.{next(_calls)}")
    return [part.to(tensor.device) for part in parts]


def _distributed() -> bool:
    return current().size > 1


def torchmetrics_sync() -> dict:
    """Keyword arguments for any torchmetrics metric: its state is summed (or joined) over every rank in ``compute()``.

    ``dist_sync_fn`` gathers each state tensor from every rank through Horovod
    (one small object allgather per state; call ``compute()`` on every rank),
    and ``distributed_available_fn`` tells torchmetrics that the job has more
    than one rank. Give each rank its rows once, without padding
    (``hk.eval_loader``), or a padding row is counted twice.
    """
    return {"dist_sync_fn": _gather, "distributed_available_fn": _distributed}


__all__ = ["torchmetrics_sync"]
