import os

import pytest

from tests.multihost.testhosts import TestHosts


def require_root():
    if os.geteuid() != 0:
        pytest.skip("test hosts need root (ip netns, sshd, /etc/hosts); run the multi-host tier as root")


@pytest.fixture(scope="module")
def cluster():
    require_root()
    with TestHosts(["hosta", "hostb"]) as c:
        yield c


@pytest.fixture
def make_cluster():
    """make_cluster(options) -> a fresh cluster with per-host variations, torn down after the test."""
    require_root()
    made = []

    def _make(options):
        c = TestHosts(["hosta", "hostb"], options).__enter__()
        made.append(c)
        return c

    yield _make
    for c in made:
        c.close()
