"""Preemption: a termination signal on any rank becomes a checkpoint at the next step boundary, on every rank.

Clusters warn before they kill: Slurm sends SIGTERM (or the signal
``--signal`` names, often SIGUSR1) to the job's tasks, Kubernetes sends
SIGTERM and waits ``terminationGracePeriodSeconds``. Often only some ranks
get it. Each rank records the signal instead of dying; at the next step
boundary the ranks agree through one tiny allreduce (a float64 sum of the
flags, through the job's backend, under one tensor name for every framework)
and all take the same branch: checkpoint, then exit with
:data:`REQUEUE_EXIT_CODE`.

No rank leaves before the checkpoint is on disk. Only rank 0 writes it, and
a rank that left at once (its ``save_checkpoint`` returns immediately) would
let the launcher, seeing a rank end, kill rank 0 mid-save and requeue onto a
checkpoint that was never written. ``save_and_exit`` runs the save on every rank, gathers each
rank's outcome, and only then do all exit 75 together, or all raise
:class:`~hvdkit.runtime.checkpoint_files.CheckpointError` naming the rank that
failed (no requeue onto a checkpoint that was not written). ``exit`` alone
waits for every rank the same way.

Example (``hvdkit.torch.PreemptionGuard`` and ``hvdkit.keras.PreemptionGuard`` are this)::

    guard = PreemptionGuard()
    ...
    if guard.requested():       # same answer on every rank
        guard.save_and_exit(hk.save_checkpoint, path, model, optimizer, epoch=epoch, batch=batch + 1)
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterable

from hvdkit.common.launcher import REQUEUE_EXIT_CODE
from hvdkit.runtime import context

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preemption:
    """Records termination signals; ``requested()`` is True on every rank once any rank got one.

    ``any_rank(flag)`` is the agreement: the sum of every rank's 0/1 flag;
    ``gather(obj)`` is every rank's ``obj``, in rank order (the save's outcome).
    """

    def __init__(self, any_rank: Callable[[int], float], gather: Callable[[object], list],
                 signals: Iterable[int] = DEFAULT_SIGNALS):
        self._any_rank = any_rank
        self._gather = gather
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
        """Collective: wait until every rank is here, then end this process with :data:`REQUEUE_EXIT_CODE`.

        Call it after the checkpoint call on every rank: rank 0 arrives only
        once its write returned, a background one too
        (``save_checkpoint(..., blocking=False)``), so no rank's exit lets the
        launcher kill rank 0 mid-save; a failed background write is raised on
        every rank instead of exiting 75.
        """
        from hvdkit.runtime.async_save import wait_for_checkpoint
        from hvdkit.runtime.checkpoint_files import CheckpointError

        # A background save in flight (save_checkpoint(..., blocking=False)) is on disk before any rank leaves:
        # a rank's exit 75 lets the launcher kill the others, rank 0 mid-write.
        try:
            wait_for_checkpoint()
            outcome = None
        except CheckpointError as exc:
            outcome = str(exc)
        failed = [(rank, why) for rank, why in enumerate(self._gather(outcome)) if why is not None]
        if failed:
            rank, why = failed[0]
            raise CheckpointError(f"the preemption checkpoint was not written (rank {rank}: {why}); the job stops "
                                  f"without exiting {REQUEUE_EXIT_CODE}, so it is not requeued onto a checkpoint "
                                  "that does not exist: fix the cause and resume from the previous checkpoint")
        sys.stdout.flush()
        sys.stderr.flush()
        raise SystemExit(REQUEUE_EXIT_CODE)

    def save_and_exit(self, save: Callable[..., object], *args, **kwargs) -> None:
        """Collective: ``save(*args, **kwargs)`` on every rank, then exit 75 together, or raise everywhere if it failed.

        ``save`` is the adapter's ``save_checkpoint`` (it writes on rank 0
        and returns at once elsewhere), or a function of the script's that calls it. Every rank learns every rank's
        outcome before any leaves: written and renamed, or the error, which
        every rank raises as :class:`~hvdkit.runtime.checkpoint_files.CheckpointError`
        naming the rank, so the job ends non-zero rather than asking to be
        requeued onto a checkpoint that does not exist.
        """
        from hvdkit.runtime.checkpoint_files import CheckpointError

        try:
            save(*args, **kwargs)
            outcome = None
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - every rank must hear of any failure (a script's
            # own save may turn a CheckpointError into SystemExit("error: ..."), as examples/pytorch_mnist.py does)
            outcome = f"{type(exc).__name__}: {exc}"
        outcomes = self._gather(outcome)
        failed = [(rank, why) for rank, why in enumerate(outcomes) if why is not None]
        if failed:
            rank, why = failed[0]
            raise CheckpointError(f"the preemption checkpoint was not written (rank {rank}: {why}); the job stops "
                                  f"without exiting {REQUEUE_EXIT_CODE}, so it is not requeued onto a checkpoint "
                                  "that does not exist: fix the cause and resume from the previous checkpoint")
        self.exit()


def PreemptionGuard(signals: Iterable[int] = DEFAULT_SIGNALS) -> Preemption:  # noqa: N802 (Horovod-style factory)
    """Record ``signals`` on this rank; ``guard.requested()`` agrees across ranks at a step boundary.

    Needs ``init()`` first; the agreement goes through the job's backend (:mod:`hvdkit.runtime.backend`).
    """
    backend = context.backend()

    def any_rank(flag: int) -> float:
        return backend.allreduce_floats([float(flag)], "sum", name="hvdkit.preemption")[0]

    def gather(obj: object) -> list:
        return backend.allgather_object(obj, name="hvdkit.preemption.outcome")

    return Preemption(any_rank, gather, signals)
