"""Name the rank that holds the others back, once an epoch, from each rank's own step time.

In synchronous data parallelism every rank's step takes as long as the
slowest's: the others wait for it in the gradient allreduce. So the time that
tells ranks apart is a rank's own share of the step: its wall time less the
time it spent blocked in that allreduce, and less the time its thread was
ready to run but waited for a CPU core that another process held (Linux
counts it per thread). That last wait is the host's load, not the rank's:
ranks that share a host share its cores, and which of them the scheduler
makes wait changes from one moment to the next. Each adapter measures the two (torch:
around the optimizer's synchronize; Keras: around the grouped allreduce in the
optimizer's ``apply``); here one small allgather an epoch brings every rank's
numbers to rank 0, which prints one line when one rank stands out.

Example::

    clock = StepClock()
    clock.add_wait(0.012); clock.step_done()          # per step (torch does this in the optimizer)
    steps, busy_s = clock.take()                      # per epoch, on every rank
    report_epoch(backend, steps, busy_s, rank=ctx.rank, size=ctx.size, watch=watch_for(ctx))
    # rank 0, when rank 1 was slow this epoch and the last: "hvdkit: rank 1 is a straggler, 2 epochs
    #     running: 41.0 ms per step this epoch against a median of 12.3 ms for the other ranks"
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

# A rank twice the others' median leaves every other rank idle half of each step: worth a line each
# epoch; a line every epoch for noise would teach users to ignore it. And a gap under 5 ms a step is not
# worth a line whatever the ratio: tiny CPU steps swing by that much.
THRESHOLD = 2.0
FLOOR_MS = 5.0
# A rank is named once it stood out this many epochs in a row: a slow node, a throttled GPU or an uneven
# shard stays slow, while another process taking a core slows one rank for an epoch and then another.
EPOCHS_RUNNING = 2


@dataclass(frozen=True)
class Straggler:
    rank: int
    step_ms: float
    median_ms: float               # the other ranks' median
    epochs: int = 1                # epochs in a row this rank stood out

    def line(self) -> str:
        running = "is a straggler this epoch" if self.epochs == 1 else f"is a straggler, {self.epochs} epochs running"
        return (f"hvdkit: rank {self.rank} {running}: {self.step_ms:.1f} ms per step this epoch "
                f"against a median of {self.median_ms:.1f} ms for the other ranks")


class StragglerWatch:
    """Remembers which rank stood out in the epochs before, so that only a lasting straggler is named."""

    def __init__(self, epochs: int = EPOCHS_RUNNING):
        self.epochs = epochs
        self.rank: int | None = None
        self.running = 0

    def confirm(self, found: Straggler | None) -> Straggler | None:
        """``found`` (this epoch's slowest rank, if it stood out) once it stood out ``epochs`` epochs in a row."""
        if found is None:
            self.rank, self.running = None, 0
            return None
        self.running = self.running + 1 if found.rank == self.rank else 1
        self.rank = found.rank
        return replace(found, epochs=self.running) if self.running >= self.epochs else None


def find_straggler(step_ms: Sequence[float | None], threshold: float = THRESHOLD,
                   floor_ms: float = FLOOR_MS) -> Straggler | None:
    """The slowest rank, when its own step time is ``threshold`` times the others' median or more.

    ``step_ms[r]`` is rank r's own step time (None: no steps timed this epoch).
    """
    timed = [(ms, r) for r, ms in enumerate(step_ms) if ms is not None]
    if len(timed) < 2:
        return None
    slowest, rank = max(timed)
    median = statistics.median(ms for ms, r in timed if r != rank)
    if slowest >= threshold * median and slowest - median >= floor_ms:
        return Straggler(rank, slowest, median)
    return None


def core_wait_s() -> float:
    """Seconds the calling thread has spent runnable but waiting for a CPU core, since it started.

    Linux counts it in ``/proc/thread-self/schedstat`` (the second field, in nanoseconds); elsewhere
    this is 0.0. Another process busy on a rank's cores shows up here, not in the rank's own work.
    """
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


_watch: tuple[object, StragglerWatch] | None = None      # (the job's context, its watch)


def watch_for(ctx) -> StragglerWatch:
    """The job's watch: one per ``init`` (a new context), shared by every ``fit`` and evaluation in it."""
    global _watch
    if _watch is None or _watch[0] is not ctx:
        _watch = (ctx, StragglerWatch())
    return _watch[1]


def report_epoch(backend, steps: int, busy_s: float, rank: int, size: int, name: str = "hvdkit.stragglers",
                 out=None, watch: StragglerWatch | None = None) -> Straggler | None:
    """One allgather of (steps, busy seconds) over ranks; rank 0 prints the straggler's line, if any.

    With a ``watch``, a rank is named only once it stood out ``watch.epochs`` epochs in a row.
    Every rank must call it (it is a collective); a rank with no steps takes part and counts as untimed.
    """
    if size < 2:
        return None
    gathered = backend.allgather_object((steps, busy_s), name=name)
    step_ms = [busy / n * 1e3 if n else None for n, busy in gathered]
    if sum(ms is not None for ms in step_ms) < 2:
        return None               # no steps since the last call (a second evaluation this epoch): nothing to compare
    straggler = find_straggler(step_ms)
    if watch is not None:
        straggler = watch.confirm(straggler)
    if straggler is not None and rank == 0:
        print(straggler.line(), file=out or sys.stderr, flush=True)
    return straggler


class StepClock:
    """This rank's steps since the last :meth:`take`: how many, and the seconds not spent waiting for others.

    A step is the time between two :meth:`step_done` calls, less the waits
    :meth:`add_wait` recorded in between, and less the time the stepping thread
    waited for a core (``core_wait``) outside those waits (a wait that spins
    on ``sched_yield`` also waits for a core: counted once); the first step
    after a take only starts the clock (the gap before it held evaluation,
    checkpoints, the loader's start). The core wait is a thread's own count,
    so a step that ends on another thread than the last counts its wall time only.
    """

    def __init__(self, clock=time.perf_counter, core_wait=core_wait_s, thread=threading.get_ident):
        self.clock, self.core_wait, self.thread = clock, core_wait, thread
        self.steps, self.busy_s, self.waited_s, self.waited_core_s = 0, 0.0, 0.0, 0.0
        self.last: tuple[float, float, int] | None = None       # (clock, core wait, thread) at the last step's end

    def add_wait(self, seconds: float, core_s: float = 0.0) -> None:
        """A wait for the other ranks of ``seconds``, ``core_s`` of them spent waiting for a core."""
        self.waited_s += seconds
        self.waited_core_s += core_s

    def step_done(self) -> None:
        now = (self.clock(), self.core_wait(), self.thread())
        if self.last is not None:
            self.steps += 1
            core = now[1] - self.last[1] - self.waited_core_s if now[2] == self.last[2] else 0.0
            self.busy_s += max(0.0, now[0] - self.last[0] - self.waited_s - max(0.0, core))
        self.last, self.waited_s, self.waited_core_s = now, 0.0, 0.0

    def take(self) -> tuple[int, float]:
        steps, busy = self.steps, self.busy_s
        self.steps, self.busy_s, self.waited_s, self.waited_core_s, self.last = 0, 0.0, 0.0, 0.0, None
        return steps, busy
