"""A fixed global batch: the same samples in each optimizer step, grouped the same way, at any world size.

In the per-rank mode (Horovod's), each of N ranks takes a batch of B and the
step averages N*B samples: the optimisation changes with N, so a job that is
requeued on another allocation, or an elastic one that loses a worker, ends
somewhere an uninterrupted run would not. Here the script states the global
batch G (and the micro-batch m); N only decides who computes what.

- Each epoch's order is cut into steps of G samples, each step into
  micro-batches of m (the last of a step may be shorter). A micro-batch is
  the unit of work: its samples and its place do not depend on N.
- Rank r takes micro-batches r, r+N, r+2N, ... of each step (none when the
  step has fewer micro-batches than there are ranks) and accumulates them.
- Each micro-batch's randomness (dropout) is seeded by its place in the run
  (:meth:`GlobalBatch.seed`), not by the rank, so it draws the same at any N.
- Each micro-batch's gradient (of a mean loss) is weighted by its share of
  the step, ``len(micro) / len(step)``, and the ranks' sums are summed once a
  step: the step's gradient is the mean over its samples however they fall.

What still depends on N is the order of the float additions (the micro-batches
a rank sums, then the ring), and whatever a layer keeps per rank across
micro-batches (BatchNorm's running statistics): docs/GLOBAL_BATCH.md.

Example::

    plan = GlobalBatch(global_batch=12, micro_batch=4, samples=30)
    plan.steps_per_epoch()              # 3: 12, 12 and 6 samples
    plan.micro_batches(2)               # [(24, 28), (28, 30)]: positions in the epoch's order
    plan.share(0, rank=1, size=2)       # [1]: rank 1 of 2 takes the second micro-batch of step 0
    plan.weight(2, 1)                   # 2/6: that micro-batch's part of step 2's mean
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hvdkit.common.errors import UserError


@dataclass(frozen=True)
class GlobalBatch:
    """The steps and micro-batches of one epoch of ``samples`` samples (see the module)."""

    global_batch: int
    micro_batch: int
    samples: int
    drop_last: bool = False

    def __post_init__(self) -> None:
        for name in ("global_batch", "micro_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"{name} must be a positive whole number, got {value!r}")
        if self.micro_batch > self.global_batch:
            raise UserError(f"micro_batch {self.micro_batch} is larger than global_batch {self.global_batch}: "
                            "a micro-batch is a part of one step's batch; give micro_batch <= global_batch")
        if self.samples < 1 or (self.drop_last and self.samples < self.global_batch):
            raise UserError(f"{self.samples} samples make no step of global_batch {self.global_batch}"
                            f"{' with drop_last=True' if self.drop_last else ''}: give a smaller global_batch")

    @classmethod
    def for_size(cls, global_batch: int, micro_batch: int | None, samples: int, size: int,
                 drop_last: bool = False) -> GlobalBatch:
        """``micro_batch`` None: one micro-batch a rank at this size (``ceil(global / size)``).

        The average stays exact at any size, but the grouping (BatchNorm's batch statistics, dropout's draws)
        then follows the size: state ``micro_batch`` for the same model at any size."""
        if micro_batch is None:
            if isinstance(global_batch, int) and not isinstance(global_batch, bool) and global_batch >= 1:
                micro_batch = math.ceil(global_batch / size)
        return cls(global_batch, micro_batch, samples, drop_last)

    def steps_per_epoch(self) -> int:
        if self.drop_last:
            return self.samples // self.global_batch
        return math.ceil(self.samples / self.global_batch)

    def step_range(self, step: int) -> tuple[int, int]:
        """Positions ``[start, stop)`` of step ``step``'s samples in the epoch's order."""
        if not 0 <= step < self.steps_per_epoch():
            raise UserError(f"step {step} is outside this epoch's 0..{self.steps_per_epoch() - 1}")
        start = step * self.global_batch
        return start, min(start + self.global_batch, self.samples)

    def micro_batches(self, step: int) -> list[tuple[int, int]]:
        """Positions ``[start, stop)`` of each micro-batch of step ``step``, in order."""
        start, stop = self.step_range(step)
        return [(i, min(i + self.micro_batch, stop)) for i in range(start, stop, self.micro_batch)]

    def share(self, step: int, rank: int, size: int) -> list[int]:
        """The micro-batches (their index in the step) that ``rank`` of ``size`` takes: round-robin."""
        if not 0 <= rank < size:
            raise UserError(f"rank {rank} is outside 0..{size - 1}")
        return list(range(rank, len(self.micro_batches(step)), size))

    def weight(self, step: int, micro: int) -> float:
        """Micro-batch ``micro``'s samples over its step's: what its mean loss's gradient is multiplied by."""
        start, stop = self.micro_batches(step)[micro]
        first, last = self.step_range(step)
        return (stop - start) / (last - first)

    def seed(self, seed: int, epoch: int, step: int, micro: int) -> int:
        """A seed for micro-batch ``micro`` of ``step`` in ``epoch``: the same on whichever rank computes it."""
        state = np.random.SeedSequence([seed % 2**63, epoch, step, micro]).generate_state(2, dtype=np.uint32)
        return int(state[0]) << 31 | int(state[1]) >> 1

    def describe(self, size: int) -> str:
        """How the global batch falls on ``size`` ranks: for the resume line and the logs."""
        micros = math.ceil(self.global_batch / self.micro_batch)
        most, fewest = math.ceil(micros / size), micros // size
        each = f"{most}" if most == fewest else f"{fewest} or {most}"
        return (f"global batch {self.global_batch} in {micros} micro-batch(es) of {self.micro_batch}, "
                f"{each} a rank on {size}")
