"""hvdkit.runtime.state.check_weights_agree: the first-step check that the ranks' weights agree (no processes)."""

import numpy as np
import pytest

from hvdkit.runtime.state import RanksDivergedError, check_weights_agree, weights_check_applies, weights_digest

pytestmark = pytest.mark.unit


class Gathered:
    """A stand-in backend whose allgather returns the digests the ranks would have sent."""

    def __init__(self, *digests):
        self.digests = list(digests)

    def allgather_object(self, obj, name):
        return self.digests


def test_equal_and_roundoff_close_weights_pass():
    w = [np.linspace(-1, 1, 101), np.ones((3, 3))]
    d = weights_digest(w)
    assert d == pytest.approx((9.0, sum(float((a ** 2).sum()) for a in w), sum(float(abs(a).sum()) for a in w)))
    check_weights_agree(Gathered(d, tuple(x * (1 + 1e-9) for x in d)), d, "fix it")


def test_weights_that_differ_raise_naming_the_rank_and_the_fix():
    a, b = weights_digest([np.zeros(4), np.ones(2)]), weights_digest([np.zeros(4), np.full(2, 1.01)])
    with pytest.raises(RanksDivergedError) as err:
        check_weights_agree(Gathered(a, a, b), a, "call hk.broadcast_state(model, optimizer)")
    assert str(err.value).startswith("rank 2's weights differ from rank 0's after the first step")
    assert str(err.value).endswith("the ranks started from different weights; "
                                   "call hk.broadcast_state(model, optimizer)")


def test_the_check_runs_on_several_ranks_outside_elastic_jobs(monkeypatch):
    monkeypatch.delenv("HOROVOD_ELASTIC", raising=False)
    assert weights_check_applies(2) and not weights_check_applies(1)
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")     # a worker that joins later would gather alone
    assert not weights_check_applies(2)
