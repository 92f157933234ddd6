"""hvdkit.runtime.stragglers: who is named, against what, and the one allgather an epoch."""

import io
import os
import subprocess
import sys
import time

import pytest

from hvdkit.runtime.stragglers import StepClock, StragglerWatch, core_wait_s, find_straggler, report_epoch

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("step_ms, expected", [
    ([12.0, 41.0], (1, 41.0, 12.0)),                 # against the other ranks' median, not one that includes it
    ([12.0, 12.5, 11.8, 30.0], (3, 30.0, 12.0)),     # 2.5x
    ([9.0, 16.3], None),                             # 1.8x: a balanced job beside another on 2 cores
    ([2.0, 5.0], None),                              # 2.5x, but 3 ms a step is not worth a line
    ([12.0, None], None),                            # one rank timed no steps
    ([None, None, 9.0, 30.0], (3, 30.0, 9.0)),
])
def test_find_straggler(step_ms, expected):
    found = find_straggler(step_ms)
    assert (found and (found.rank, found.step_ms, found.median_ms)) == (expected or None)


class FakeBackend:
    def __init__(self, gathered):
        self.gathered, self.calls = gathered, 0

    def allgather_object(self, obj, name):
        self.calls += 1
        return self.gathered


def test_report_epoch_prints_on_rank_0_only():
    backend, out = FakeBackend([(10, 0.123), (10, 0.41)]), io.StringIO()
    assert report_epoch(backend, 10, 0.123, rank=0, size=2, out=out).rank == 1
    assert out.getvalue() == ("hvdkit: rank 1 is a straggler this epoch: 41.0 ms per step this epoch against a "
                              "median of 12.3 ms for the other ranks\n")
    quiet = io.StringIO()
    assert report_epoch(backend, 10, 0.41, rank=1, size=2, out=quiet).rank == 1 and quiet.getvalue() == ""
    assert report_epoch(backend, 10, 0.41, rank=0, size=1, out=quiet) is None and backend.calls == 2


def test_step_clock_subtracts_waits_and_skips_the_first_step():
    now = iter([0.0, 0.050, 0.100, 5.0, 5.030])
    clock = StepClock(clock=lambda: next(now), core_wait=lambda: 0.0)
    clock.step_done()                     # starts the clock
    clock.add_wait(0.040)
    clock.step_done()                     # 50 ms, 40 of them waiting
    clock.step_done()                     # 50 ms
    assert clock.take() == (2, pytest.approx(0.060))
    clock.step_done()                     # after evaluation: starts again
    clock.step_done()
    assert clock.take() == (1, pytest.approx(0.030))


def test_step_clock_leaves_out_the_time_the_thread_waited_for_a_core():
    """Another process on the rank's core: 60 ms of wall time a step, 35 of them ready to run but not running."""
    now, core = iter([0.0, 0.060, 0.120]), iter([1.0, 1.035, 1.070])
    clock = StepClock(clock=lambda: next(now), core_wait=lambda: next(core))
    for _ in range(3):
        clock.step_done()
    assert clock.take() == (2, pytest.approx(0.050))


def test_step_clock_counts_a_core_wait_inside_the_allreduce_wait_once_and_none_across_threads():
    """A wait that spins also waits for a core: those seconds are in the allreduce wait already. And the core wait
    is per thread: a step that ends on another thread than the last keeps its wall time less the waits."""
    now, core = iter([0.0, 0.060, 0.120]), iter([1.0, 1.030, 1.030])
    threads = iter([7, 7, 8])
    clock = StepClock(clock=lambda: next(now), core_wait=lambda: next(core), thread=lambda: next(threads))
    clock.step_done()
    clock.add_wait(0.020, core_s=0.010)       # 20 ms waiting for the others, 10 of them for a core
    clock.step_done()                         # 60 ms - 20 waiting - (30 - 10) for a core = 20 ms
    clock.step_done()                         # another thread: 60 ms, no core term
    assert clock.take() == (2, pytest.approx(0.080))


def test_core_wait_grows_while_another_process_holds_this_threads_core():
    if not os.path.exists("/proc/thread-self/schedstat"):
        pytest.fail("no /proc/thread-self/schedstat: the straggler line cannot leave out the host's load here")
    allowed = os.sched_getaffinity(0)
    hog = subprocess.Popen([sys.executable, "-c", "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass"])
    try:
        time.sleep(0.2)                              # the busy process is up and on CPU 0
        os.sched_setaffinity(0, {0})
        start = core_wait_s()
        busy_until = time.thread_time() + 0.2
        while time.thread_time() < busy_until:
            pass
        waited = core_wait_s() - start
    finally:
        os.sched_setaffinity(0, allowed)
        hog.kill()
        hog.wait()
    assert waited > 0.05, waited                     # two on one core: this thread waited for much of its turn


def test_a_watch_names_only_a_rank_that_stands_out_epochs_in_a_row():
    """A balanced job beside other work on 2 cores had one slow epoch on one rank (57.8 against 21.4 ms): that is
    load, not a straggler. A rank slow this epoch and the last is named, with the epochs counted."""
    backend, out = FakeBackend([(10, 0.214), (10, 0.578)]), io.StringIO()
    watch = StragglerWatch()
    assert report_epoch(backend, 10, 0.2, rank=0, size=2, out=out, watch=watch) is None and out.getvalue() == ""
    found = report_epoch(backend, 10, 0.2, rank=0, size=2, out=out, watch=watch)
    assert (found.rank, found.epochs) == (1, 2)
    assert out.getvalue() == ("hvdkit: rank 1 is a straggler, 2 epochs running: 57.8 ms per step this epoch "
                              "against a median of 21.4 ms for the other ranks\n")
    assert report_epoch(backend, 10, 0.2, rank=0, size=2, out=io.StringIO(), watch=watch).epochs == 3
    backend.gathered = [(10, 0.578), (10, 0.214)]         # now rank 0: its first epoch
    assert report_epoch(backend, 10, 0.2, rank=0, size=2, out=out, watch=watch) is None
    backend.gathered = [(10, 0.2), (10, 0.21)]            # even again: the count starts over
    assert report_epoch(backend, 10, 0.2, rank=0, size=2, watch=watch) is None
    backend.gathered = [(10, 0.214), (10, 0.578)]
    assert report_epoch(backend, 10, 0.2, rank=0, size=2, out=out, watch=watch) is None


def test_a_call_with_no_steps_since_the_last_leaves_the_watch_as_it_was():
    """hk.evaluate reports at each call: a second evaluation in an epoch (a test set after validation) has no
    steps to compare, and must not reset the count, or a lasting straggler is never named."""
    watch, slow = StragglerWatch(), FakeBackend([(10, 0.214), (10, 0.578)])
    idle = FakeBackend([(0, 0.0), (0, 0.0)])
    assert report_epoch(slow, 10, 0.2, rank=0, size=2, watch=watch) is None
    assert report_epoch(idle, 0, 0.0, rank=0, size=2, watch=watch) is None
    assert report_epoch(slow, 10, 0.2, rank=0, size=2, out=io.StringIO(), watch=watch).epochs == 2
