"""The fixed global batch's plan (hvdkit/runtime/global_batch.py): the same steps and micro-batches at any size."""

import pytest

from hvdkit.common.errors import UserError
from hvdkit.runtime.global_batch import GlobalBatch

pytestmark = pytest.mark.unit


def test_every_sample_is_in_one_micro_batch_of_one_step_and_one_rank_at_any_size():
    plan = GlobalBatch(global_batch=12, micro_batch=5, samples=31)
    assert plan.steps_per_epoch() == 3
    assert plan.micro_batches(0) == [(0, 5), (5, 10), (10, 12)]
    assert plan.micro_batches(2) == [(24, 29), (29, 31)]
    for size in (1, 2, 3, 4, 7):
        taken = []
        for step in range(plan.steps_per_epoch()):
            for rank in range(size):
                for micro in plan.share(step, rank, size):
                    start, stop = plan.micro_batches(step)[micro]
                    taken += range(start, stop)
        assert sorted(taken) == list(range(31)), size


def test_weights_make_each_step_the_mean_over_its_samples():
    plan = GlobalBatch(global_batch=12, micro_batch=5, samples=31)
    for step in range(plan.steps_per_epoch()):
        weights = [plan.weight(step, m) for m in range(len(plan.micro_batches(step)))]
        assert sum(weights) == pytest.approx(1.0)
    assert plan.weight(0, 2) == 2 / 12 and plan.weight(2, 0) == 5 / 7


def test_more_ranks_than_micro_batches_leaves_some_ranks_none():
    plan = GlobalBatch(global_batch=4, micro_batch=2, samples=8)
    assert [plan.share(0, r, 3) for r in range(3)] == [[0], [1], []]


def test_seeds_depend_on_the_place_in_the_run_not_the_rank():
    plan = GlobalBatch(global_batch=4, micro_batch=2, samples=8)
    seeds = {plan.seed(7, e, s, m) for e in range(3) for s in range(2) for m in range(2)}
    assert len(seeds) == 12 and all(0 <= s < 2**63 for s in seeds)
    assert plan.seed(7, 1, 1, 0) == GlobalBatch(4, 2, 8).seed(7, 1, 1, 0)
    assert plan.seed(8, 1, 1, 0) != plan.seed(7, 1, 1, 0)


def test_drop_last_leaves_the_short_step_out():
    assert GlobalBatch(12, 4, 31, drop_last=True).steps_per_epoch() == 2
    with pytest.raises(UserError, match="give a smaller global_batch"):
        GlobalBatch(12, 4, 11, drop_last=True)


def test_without_a_micro_batch_each_rank_takes_one():
    assert GlobalBatch.for_size(12, None, 100, size=3).micro_batch == 4
    assert GlobalBatch.for_size(12, None, 100, size=5).micro_batch == 3
    assert GlobalBatch.for_size(12, 2, 100, size=5).micro_batch == 2


@pytest.mark.parametrize("kwargs, says", [
    (dict(global_batch=0, micro_batch=1), "global_batch must be a positive whole number"),
    (dict(global_batch=4, micro_batch=2.5), "micro_batch must be a positive whole number"),
    (dict(global_batch=4, micro_batch=8), "give micro_batch <= global_batch"),
])
def test_bad_sizes_are_one_line_naming_the_fix(kwargs, says):
    with pytest.raises(UserError, match=says):
        GlobalBatch(samples=100, **kwargs)


def test_the_description_says_how_the_batch_falls_on_the_ranks():
    plan = GlobalBatch(12, 2, 60)
    assert plan.describe(4) == "global batch 12 in 6 micro-batch(es) of 2, 1 or 2 a rank on 4"
    assert plan.describe(3) == "global batch 12 in 6 micro-batch(es) of 2, 2 a rank on 3"
