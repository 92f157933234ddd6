"""Metrics over every rank: ``evaluate``'s exact loss and accuracy, sums over ranks, and torchmetrics.

``evaluate(model, loader)`` sums loss and correct predictions over each rank's
shard and adds the sums over ranks, so it equals one process's pass.

torchmetrics: its state gathered through Horovod, since Horovod jobs have no torch.distributed.
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
import math

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from hvdkit.runtime import context
from hvdkit.torch.context import ADAPTER, current
from hvdkit.torch.stragglers import report_stragglers

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


def allreduce_sum(values: list[float] | torch.Tensor, name: str) -> torch.Tensor:
    """Sum a small vector of numbers over all ranks, in float64 so counts stay exact."""
    tensor = torch.as_tensor(values, dtype=torch.float64).detach().cpu()
    summed = context.backend(ADAPTER).allreduce_floats(tensor.flatten().tolist(), "sum", name=name)
    return torch.tensor(summed, dtype=torch.float64).reshape(tensor.shape)


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: DataLoader, *, loss_fn=F.cross_entropy) -> dict[str, float]:
    """Loss and accuracy over the whole dataset behind ``loader``'s shards, exact across ranks.

    Each rank sums loss and correct predictions over its shard; the sums and
    counts are added over ranks, so the result equals a single-process pass.
    It also reports a straggler rank for the steps since the last call (:func:`report_stragglers`).

    ``loss_fn(outputs, targets, reduction="sum")`` is called on the model's
    raw outputs, as torch's functional losses take it: ``F.cross_entropy``
    for logits, ``F.nll_loss`` for a model ending in ``log_softmax``.
    Accuracy compares ``outputs.argmax(1)`` with the targets.
    """
    device = current().device
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)      # loss sum, correct, count
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        out = model(x)
        totals[0] += loss_fn(out, y, reduction="sum").item()
        totals[1] += (out.argmax(dim=1) == y).sum().item()
        totals[2] += y.numel()
    model.train(was_training)
    loss_sum, correct, count = allreduce_sum(totals, name="hvdkit.evaluate").tolist()
    report_stragglers()            # once an epoch on every rank, as evaluate is: one small allgather
    if count == 0:
        return {"loss": math.nan, "accuracy": math.nan, "count": 0}
    return {"loss": loss_sum / count, "accuracy": correct / count, "count": int(count)}
