"""Each test's CPU seconds as the JUnit property ``cpu_s`` (scripts/test_durations.py prints them).

``make test``'s two lanes share 2 cores, so a test's wall time there says as much about the other lane as
about the test; its CPU seconds (this process, and every job it ran once reaped) say what it costs. A job
pool's ranks report each scenario's CPU, which counts for the test that ran it (:func:`charge`); the test
that closes a pool counts what the ranks spent besides (their start). A plugin of the root conftest.py, so
the docs' blocks are counted too.
"""

from __future__ import annotations

import resource

import pytest

_CPU_AT_START = pytest.StashKey[float]()
_charged = 0.0          # CPU seconds spent for the running test that no child it reaped carries


def charge(seconds: float) -> None:
    """Count ``seconds`` of CPU for the running test: a pool scenario's, which its ranks measured. A negative
    amount takes back CPU that reaping a pool's ranks counts again."""
    global _charged
    _charged += seconds


def _used(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _cpu_seconds() -> float:
    """CPU seconds of this process and of every child it has reaped (the jobs a test ran, and their ranks)."""
    return _used(resource.RUSAGE_SELF) + children_cpu()


def children_cpu() -> float:
    """CPU seconds of the children this process has reaped, with theirs."""
    return _used(resource.RUSAGE_CHILDREN)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _charged
    _charged = 0.0
    item.stash[_CPU_AT_START] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    if call.when == "teardown" and _CPU_AT_START in item.stash:
        item.user_properties.append(("cpu_s", f"{_cpu_seconds() - item.stash[_CPU_AT_START] + _charged:.1f}"))
    yield
