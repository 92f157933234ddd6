"""What hvdkit's elastic training shares, whatever the framework: the decorator, step counting and commits.

``@hk.elastic.run`` is :func:`run` in both adapters. ``hvdkit.torch.elastic.ElasticState``
and ``hvdkit.keras.elastic.ElasticState`` mix :class:`ElasticCommits` into
Horovod's state classes (which provide ``save()`` and ``check_host_updates()``),
take the same keywords, and say how a batch is recorded (``_consume``), how an
epoch starts (``_start_epoch``) and what a reset changes (:meth:`ElasticCommits._after_reset`).
"""

from __future__ import annotations

import functools
from typing import Callable

from hvdkit.common.errors import UserError
from hvdkit.runtime import async_save, context
from hvdkit.runtime.lr import scale_lr_for


def run(func: Callable) -> Callable:
    """``@hk.elastic.run``: restore, re-sync and retry ``func(state)`` whenever the job changes.

    Horovod's own loop (``horovod.common.elastic.run_fn``): sync the state,
    run; on a failed collective restore the last commit, on a host change keep
    it; then reset Horovod (shutdown, init) and run again. The backend is
    looked up when ``func`` runs, so the decorator may be applied before
    ``init()``. A failure counts as a failed collective when Horovod says so
    or the backend recognises it (:meth:`hvdkit.runtime.backend.Backend.collective_failure`).
    """
    from horovod.common.elastic import run_fn
    from horovod.common.exceptions import HorovodInternalError

    @functools.wraps(func)
    def attempt(state, *args, **kwargs):
        async_save.raise_held()         # a background save's failure that a reset met, now the sync is done
        try:
            return func(state, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - re-raised unless it is a failed Horovod collective
            if not isinstance(exc, HorovodInternalError) and context.backend().collective_failure(exc):
                raise HorovodInternalError(exc) from exc
            raise

    def reset():
        # A background save in flight finishes first: its rank may become another, or another rank 0 may save.
        # Its failure is raised after the sync that follows, where the script's own code runs again: raised here
        # or in the sync (whose optimizer broadcast may step), on one rank, it would leave Horovod's loop there.
        async_save.wait_and_hold()
        context.backend().reset()

    return run_fn(attempt, reset)


class ElasticCommits:
    step: int
    epoch: int
    # Each state class says how a reset's rates reach its optimizer (torch: per param group; Keras: one rate).
    _set_learning_rates: Callable[[list[float]], None]

    def _init_commits(self, commit_every: int, base_lr) -> None:
        if commit_every < 1:
            raise UserError(f"commit_every must be >= 1, got {commit_every}")
        self._commit_every = commit_every
        self._commit_callbacks: list[Callable] = []
        self._base_lr = base_lr

    def _after_reset(self) -> None:
        """After every reset (and once at the start): re-read rank and size, rescale the learning rate."""
        ctx = context.refresh()
        if self._base_lr is not None:
            self._set_learning_rates([scale_lr_for(base, ctx) for base in self._base_lr])

    def register_commit_callbacks(self, callbacks: list[Callable]) -> None:
        """Called right after each commit is saved, before host updates are checked (e.g. to log the step)."""
        self._commit_callbacks.extend(callbacks)

    def commit(self) -> None:
        # Horovod's commit is save() then check_host_updates(), which may raise
        # to start a reset; the callbacks run in between, so every commit they
        # report is one training will resume from.
        self.save()
        for callback in self._commit_callbacks:
            callback(self)
        self.check_host_updates()

    def step_done(self, samples: int, *, last_of_epoch: bool = False) -> None:
        """One optimizer step over ``samples`` per rank finished on every rank: record it, commit when due.

        The epoch's last step is not committed on its own (``epoch_done``
        commits it together with the new epoch): a commit that has consumed
        the whole epoch but not yet moved on would resume into an empty epoch,
        which Keras's ``fit`` cannot run.
        """
        self.step += 1
        self._consume(samples)
        if self.step % self._commit_every == 0 and not last_of_epoch:
            self.commit()

    def epoch_done(self) -> None:
        """End of an epoch: the next one starts (new shuffle, nothing consumed yet); commits."""
        self.epoch += 1
        self._start_epoch()
        self.commit()
