"""What hvdkit's elastic states share, whatever the framework: step counting and commits.

``hvdkit.torch.elastic.ElasticState`` and ``hvdkit.keras.elastic.ElasticState``
mix this into Horovod's state classes (which provide ``save()`` and
``check_host_updates()``) and say how a batch is recorded (``_consume``) and
how an epoch starts (``_start_epoch``).
"""

from __future__ import annotations

from typing import Callable


class ElasticCommits:
    step: int
    epoch: int

    def _init_commits(self, commit_every: int) -> None:
        if commit_every < 1:
            raise ValueError(f"commit_every must be >= 1, got {commit_every}")
        self._commit_every = commit_every
        self._commit_callbacks: list[Callable] = []

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
