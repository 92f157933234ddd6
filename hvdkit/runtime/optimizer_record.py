"""What hvdkit keeps on an optimizer it wrapped: one typed record, the only hvdkit attribute on the object.

Both adapters' ``DistributedOptimizer`` attach it; the checkpoint, warmup,
straggler and sharding code read it through :func:`record_of`, so a reader
finds every fact hvdkit hangs on an optimizer in this one class.

Example::

    record = attach(optimizer, op="average")
    record_of(optimizer).op                 # "average": the rate's scaling rule, for a resume on another size
    record_of(torch.optim.SGD(params, lr=0.1))   # None: not wrapped by hvdkit
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ATTRIBUTE = "_hvdkit"


@dataclass
class OptimizerRecord:
    op: str = "average"                 # the gradient op: how the rate was scaled, undone on a resume
    distributed: bool = False           # this optimizer already allreduces (wrapping it again is refused)
    sharded: bool = False               # it keeps 1/N of the optimizer state (shard_optimizer_state)
    slices: Any = None                  # that state's slices: torch's Shards, Keras's Slices (once built)
    average: Any = None                 # torch: the backward-end averaging (hvdkit/torch/averaging.py)
    nonfinite: Any = None               # torch: the NaN/inf check before each step
    accumulator_hooks: list = field(default_factory=list)   # torch: hooks for parameters that get a gradient later
    local_step: bool = False            # torch Adasum: True while its per-parameter local steps run
    warmup_target: float | None = None  # Keras: the rate hk.callbacks()'s warmup ramps to
    allreduce_timer: Any = None         # Keras 3: the allreduce's seconds, for the straggler line
    global_batch: Any = None            # the fixed global batch's loader, when there is one (torch: global_batch.py)


def record_of(optimizer) -> OptimizerRecord | None:
    """The record hvdkit attached to this very object (not one its class or a wrapped optimizer holds)."""
    return getattr(optimizer, "__dict__", {}).get(ATTRIBUTE)


def attach(optimizer, **fields) -> OptimizerRecord:
    """The optimizer's record, made if it has none, with ``fields`` set on it."""
    record = record_of(optimizer)
    if record is None:
        record = OptimizerRecord()
        # Past the class's __setattr__: Keras's tracks attributes and tf-keras's treats some as hyperparameters.
        object.__setattr__(optimizer, ATTRIBUTE, record)
    for name, value in fields.items():
        if not hasattr(record, name):
            raise AttributeError(f"OptimizerRecord has no field {name!r}")
        setattr(record, name, value)
    return record


def global_batch_of(optimizer):
    """The fixed global batch the optimizer was wrapped with (``DistributedOptimizer(global_batch=...)``), or None."""
    record = record_of(optimizer)
    return None if record is None else record.global_batch


def op_of(optimizer) -> str:
    """The gradient op the optimizer was wrapped with; ``"average"`` for one hvdkit did not wrap."""
    record = record_of(optimizer)
    return "average" if record is None else record.op
