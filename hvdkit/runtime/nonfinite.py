"""A NaN or inf gradient on one rank: which rank made it, said once, before the step spreads it.

Averaging makes one rank's non-finite gradient every rank's, so after one
step every rank's weights are NaN and training goes on without a word (the
job even exits 0). torch looks at the averaged gradients before the
optimizer applies them (one pass and one host sync a step), and only when
those are non-finite do the ranks gather which of them produced it; every
rank then raises :class:`NonFiniteGradientError` with the same message, and
the weights keep their last finite values. Keras's ``fit`` gives callbacks
no gradients, so there the ranks compare their batch losses after each
batch (one small allreduce) and stop together, naming the rank.

Example::

    first_bad = [(rank, name) for rank, name in enumerate(gathered) if name]
    raise NonFiniteGradientError(nonfinite_message(first_bad, step=12, size=2))
"""

from __future__ import annotations

from collections.abc import Sequence

from hvdkit.common.errors import UserError


class NonFiniteGradientError(UserError):
    """The averaged gradient holds NaN or inf; the message names the rank that produced it."""


OFF_SWITCH = "pass check_finite=False to hk.DistributedOptimizer to apply such steps anyway"


def nonfinite_message(bad: Sequence[tuple[int, str]], *, step: int, size: int) -> str:
    """One line: which ranks produced a non-finite gradient (first parameter of each), at which step, what to do.

    ``bad`` is ``[(rank, parameter name)]`` for the ranks whose own gradient
    was non-finite; empty when every rank's was finite and the average
    overflowed.
    """
    where = f"at step {step} (counted from 1 on this optimizer)"
    if not bad:
        return (f"the averaged gradient is non-finite {where} although every rank's own gradient was finite: the sum "
                f"of {size} ranks' gradients overflowed (compression='fp16'?); the step was not applied; lower the "
                f"learning rate or the loss scale, or {OFF_SWITCH}")
    ranks = ", ".join(f"rank {rank} (first in {name!r})" for rank, name in bad[:4])
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    return (f"{ranks}{more} produced a non-finite (NaN or inf) gradient {where}, and averaging would spread it to "
            f"every rank's weights, so the step was not applied: look at that rank's input and loss at this step "
            f"(a log of 0, a division by 0, a learning rate too high); for mixed precision use torch.amp.GradScaler, "
            f"which skips such steps; or {OFF_SWITCH}")


def nonfinite_loss_message(ranks: Sequence[int], *, epoch: int, batch: int) -> str:
    """One line for Keras: which ranks' batch loss was non-finite, where, and what to do."""
    names = ", ".join(f"rank {r}" for r in ranks[:4]) + (f" and {len(ranks) - 4} more" if len(ranks) > 4 else "")
    return (f"{names} computed a non-finite (NaN or inf) loss at epoch {epoch + 1}, batch {batch + 1}, and averaging "
            f"spreads its gradient to every rank's weights, so every rank stops here: look at that rank's input at "
            f"this batch (a log of 0, a division by 0, a learning rate too high); for mixed precision use the "
            f"mixed_float16 policy, whose LossScaleOptimizer skips such steps; or pass check_finite=False to "
            f"hk.callbacks to train on")
