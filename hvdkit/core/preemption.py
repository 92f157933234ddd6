"""Preemption: a termination signal on any rank becomes a checkpoint at the next step boundary, on every rank.

Clusters warn before they kill: Slurm sends SIGTERM (or the signal
``--signal`` names, often SIGUSR1) to the job's tasks, Kubernetes sends
SIGTERM and waits ``terminationGracePeriodSeconds``. Often only some ranks
get it. Each rank records the signal instead of dying; at the next step
boundary the ranks agree through one tiny allreduce (a float64 sum of the
flags, through the job's backend, under one tensor name for every framework)
and all take the same branch: checkpoint, then exit with
:data:`REQUEUE_EXIT_CODE`.

Example (``hvdkit.torch.PreemptionGuard`` and ``hvdkit.keras.PreemptionGuard`` are this)::

    guard = PreemptionGuard()
    ...
    if guard.requested():       # same answer on every rank
        save(); guard.exit()
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterable

from hvdkit.core import context

# EX_TEMPFAIL (sysexits.h): "try again later". A batch script can requeue on it
# (examples/slurm/train_gpu.sbatch), and it differs from a crash's exit code.
REQUEUE_EXIT_CODE = 75
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preemption:
    """Records termination signals; ``requested()`` is True on every rank once any rank got one.

    ``any_rank(flag)`` is the agreement: the sum of every rank's 0/1 flag.
    """

    def __init__(self, any_rank: Callable[[int], float], signals: Iterable[int] = DEFAULT_SIGNALS):
        self._any_rank = any_rank
        self.received: int | None = None      # the signal this rank got, if any
        self._agreed = False
        for sig in signals:
            signal.signal(sig, self._record)

    def _record(self, signum, frame) -> None:
        self.received = signum

    def requested(self) -> bool:
        """Collective: call at the same step boundary on every rank. True once any rank got a signal."""
        if not self._agreed:
            self._agreed = self._any_rank(1 if self.received is not None else 0) > 0
        return self._agreed

    def exit(self) -> None:
        """End this process with :data:`REQUEUE_EXIT_CODE` (after the checkpoint was written)."""
        sys.stdout.flush()
        sys.stderr.flush()
        raise SystemExit(REQUEUE_EXIT_CODE)


def PreemptionGuard(signals: Iterable[int] = DEFAULT_SIGNALS) -> Preemption:  # noqa: N802 (Horovod-style factory)
    """Record ``signals`` on this rank; ``guard.requested()`` agrees across ranks at a step boundary.

    Needs ``init()`` first; the agreement goes through the job's backend (:mod:`hvdkit.core.backend`).
    """
    backend = context.backend()

    def any_rank(flag: int) -> float:
        return backend.allreduce_floats([float(flag)], "sum", name="hvdkit.preemption")[0]

    return Preemption(any_rank, signals)
