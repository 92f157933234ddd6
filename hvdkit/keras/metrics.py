"""Keras metrics over every rank, exactly as one process over all the data would compute them.

A Keras metric keeps sums (a Mean's total and count, Precision's true and
false positives, AUC's confusion counts at each threshold) and computes its
result from them. Averaging each rank's *result*, as Horovod's
``MetricAverageCallback`` does, divides counts by the number of ranks and
turns ratios into a mean of per-rank ratios. Summing the *state* over the
ranks, then computing the result, gives one process's number: this is what
torchmetrics' ``sync`` does for torch, and it costs one allreduce of the
metrics' variables (a few floats, 4 x 200 for an AUC).

``hk.callbacks()`` does this for ``fit``'s logs and :func:`evaluate` for
``model.evaluate``. Example (a custom loop)::

    for x, y in val_batches:
        val_accuracy.update_state(y, model(x, training=False))
    hk.sync_metrics(val_accuracy)          # every rank: the whole job's state
    print(float(val_accuracy.result()))

Metrics whose state is not a sum over samples (a running maximum, a user's
metric that keeps a last value) are not exact this way; Keras's own metrics
in ``keras.metrics`` all keep sums.
"""

from __future__ import annotations

import itertools

import numpy as np

from hvdkit.keras.collectives import backend_for, variable_numpy
from hvdkit.keras.context import current

_calls = itertools.count()


def metric_variables(metrics) -> list:
    """Every state variable of ``metrics`` (a Keras 3 compile-metrics container holds its metrics' own), once each."""
    seen, out = set(), []
    for metric in metrics:
        for variable in metric.variables:
            if id(variable) not in seen:
                seen.add(id(variable))
                out.append(variable)
    return out


def sync_metrics(*metrics) -> None:
    """Collective: replace each metric's state by its sum over every rank, so ``result()`` is the whole job's.

    Call it on every rank, with the same metrics in the same order, after the
    last ``update_state`` of the epoch and before ``result()``; ``reset_state``
    starts the next epoch as usual. Leave padding rows out of what the metric
    sees (``hk.shard_arrays(x_val, y_val, pad=False)`` for evaluation data),
    or they are counted.
    """
    ctx = current()
    variables = metric_variables(metrics)
    if ctx.size == 1 or not variables:
        return
    values = [variable_numpy(v) for v in variables]
    flat = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in values])
    total = backend_for(ctx.mode).allreduce_floats(flat.tolist(), "sum", name=f"hvdkit.sync_metrics.{next(_calls)}")
    offset = 0
    for variable, value in zip(variables, values):
        n = value.size
        variable.assign(np.asarray(total[offset:offset + n]).reshape(value.shape).astype(value.dtype))
        offset += n


def evaluate(model, x=None, y=None, *, return_dict: bool = False, **kwargs):
    """Collective: ``model.evaluate`` of each rank's shard, returning one process's numbers over all of them.

    Give each rank its rows once (``hk.shard_arrays(x_val, y_val, pad=False)``):
    the ranks may run different numbers of batches here. Returns what
    ``model.evaluate`` returns (a list, a number, or with ``return_dict=True``
    a dict), from the metric states summed over the ranks.
    """
    local = model.evaluate(x, y, return_dict=True, **kwargs)
    sync_metrics(*model.metrics)
    synced = {k: float(v) for k, v in model.get_metrics_result().items()}
    results = {k: synced.get(k, v) for k, v in local.items()}      # model.evaluate's keys, in its order
    if return_dict:
        return results
    flatten = getattr(model, "_flatten_metrics_in_order", None)     # Keras's own list order
    values = flatten(results) if flatten is not None else list(results.values())
    return values[0] if isinstance(values, list) and len(values) == 1 else values
