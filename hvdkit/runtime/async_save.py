"""Checkpoints written in the background: the training thread pays for the host copy, not for the write.

``save_checkpoint(..., blocking=False)`` (both adapters) gathers as a blocking
save does (a collective, when the optimizer state is sharded), copies the
state to host memory on the writing rank, and returns; a thread then computes
the integrity digest, writes, fsyncs, renames and prunes (``keep_last``) as a
blocking save would. At most one save is in flight in a process: the next save
waits for it first, so host memory holds at most one copy of the state.

Where the script goes on, the save is waited for:

- the next ``save_checkpoint`` (blocking or not), and ``hk.wait_for_checkpoint()`` (:func:`wait_for_checkpoint`);
- the preemption guard's exit (``PreemptionGuard.exit``, and the Keras
  preemption checkpoint), before any rank exits 75;
- an elastic reset (``hk.elastic.run``), before Horovod is re-initialised;
- the end of the process: the writer is not a daemon thread, so Python waits
  for it, and a failure then is printed and the exit status is 1.

A failed background save is raised as the same one-line
:class:`~hvdkit.runtime.checkpoint_files.CheckpointError` a blocking save
gives, at the first of those, or at the next optimizer step (:func:`check`).
An elastic reset holds it instead (:func:`wait_and_hold`): it is raised when
the training function runs again after the sync (:func:`raise_held`), or at
the process's end.

Example::

    start(lambda: save_to(path, write, ".pt", step, keep_last), path)   # rank 0, after the host copy
    ...
    wait_for_checkpoint()        # the file is on disk, or its CheckpointError is raised here
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable

from hvdkit.runtime.checkpoint_files import CheckpointError


class _Save:
    """One save in flight: its thread, and what it wrote or why it failed."""

    def __init__(self, run: Callable[[], str], target: str):
        self.target = target
        self.written: str | None = None
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.seconds: float | None = None
        # Not a daemon: Python joins it before the process ends, so a script that returns mid-write still writes.
        self.thread = threading.Thread(target=self._run, args=(run,), name="hvdkit-checkpoint-writer")

    def _run(self, run: Callable[[], str]) -> None:
        try:
            self.written = run()
        except BaseException as exc:  # noqa: BLE001 - kept for the training thread, which raises it
            self.error = exc
        finally:
            self.seconds = time.monotonic() - self.started


_pending: _Save | None = None
_lock = threading.Lock()
_exit_hook = False


def start(run: Callable[[], str], target: str) -> None:
    """Write in the background: ``run()`` writes the checkpoint and returns its path.

    Call :func:`wait_for_checkpoint` first: one save at a time."""
    global _pending, _exit_hook
    with _lock:
        assert _pending is None, "a save is in flight: checkpoint.save waits for it before it starts another"
        _pending = _Save(run, target)
        if not _exit_hook:
            atexit.register(_at_exit)
            _exit_hook = True
        _pending.thread.start()


def in_flight() -> bool:
    """Whether a background save was started and not yet waited for (it may have finished)."""
    return _pending is not None


def wait_for_checkpoint() -> str | None:
    """Block until the save in flight is on disk and return its path (None: there was none).

    Raises its :class:`CheckpointError` (another error becomes one, naming
    the file) when the background write failed: the previous checkpoint is
    then untouched, as after a failed blocking save. Only the writing rank
    (rank 0) raises; the others meet it at their next collective.
    """
    global _pending
    with _lock:
        save, _pending = _pending, None
    if save is None:
        return None
    save.thread.join()
    failure = _failure(save)
    if failure is not None:
        raise failure
    return save.written


def _failure(save: _Save) -> CheckpointError | None:
    """A finished save's error as a CheckpointError, or None when it wrote its file."""
    if save.error is not None:
        if isinstance(save.error, CheckpointError):
            return save.error
        failure = CheckpointError(f"the background save of checkpoint {save.target!r} failed "
                                  f"({type(save.error).__name__}: {save.error}); the previous checkpoint is "
                                  "untouched: fix the cause and save again")
        failure.__cause__ = save.error
        return failure
    return None


_held: CheckpointError | None = None      # a failure an elastic reset met, for raise_held or the process's end


def wait_and_hold() -> None:
    """:func:`wait_for_checkpoint`, keeping a failure for :func:`raise_held` instead of raising it (an elastic
    reset: raised there, or in the sync after it, on one rank, it would leave Horovod's loop on that rank)."""
    global _held
    try:
        wait_for_checkpoint()
    except CheckpointError as exc:
        _held = _held or exc                    # the first one, if two resets met failures


def raise_held() -> None:
    """Raise the failure :func:`wait_and_hold` kept, once (elastic training's function, after the sync)."""
    global _held
    failure, _held = _held, None
    if failure is not None:
        raise failure


def check() -> None:
    """Raise now, without blocking, if the save in flight has already failed (at the next step)."""
    save = _pending
    if save is not None and not save.thread.is_alive() and save.error is not None:
        wait_for_checkpoint()


def _at_exit() -> None:
    """At the process's end (the writer already joined): a failure is printed as an exception line, exit 1."""
    try:
        wait_for_checkpoint()
        raise_held()
    except CheckpointError as exc:
        sys.stdout.flush()
        print(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}", file=sys.stderr, flush=True)
        os._exit(1)
