"""Every rank gets the same number of rows, so every rank runs the same number of steps."""

import math

import numpy as np
import pytest

from hvdkit.common.errors import UserError
from hvdkit.runtime.sharding import shard_indices, shard_together, take_shard

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("length, size", [(1025, 2), (257, 2), (1057, 3), (10, 4), (3, 4), (1797, 3), (8, 4)])
def test_padded_shards_are_equal_and_cover_every_row(length, size):
    shards = [shard_indices(length, r, size) for r in range(size)]
    assert {len(s) for s in shards} == {math.ceil(length / size)}
    rows = [i for s in shards for i in s]
    assert set(rows) == set(range(length))                       # nothing dropped
    assert len(rows) - length == (-length) % size                 # at most size - 1 repeats
    for batch in (32, 128, 479):                                  # the batch counts the issue hung on
        assert len({math.ceil(len(s) / batch) for s in shards}) == 1


@pytest.mark.parametrize("length, size", [(1025, 2), (1057, 3), (10, 4)])
def test_drop_remainder_leaves_the_last_rows_out(length, size):
    shards = [shard_indices(length, r, size, drop_remainder=True) for r in range(size)]
    assert {len(s) for s in shards} == {length // size}
    assert sorted(i for s in shards for i in s) == list(range(length - length % size))


def test_too_few_rows_is_an_error_that_says_how_many():
    with pytest.raises(UserError, match="0 rows cannot be split over 2 ranks: give at least 2 rows"):
        shard_indices(0, 0, 2)
    with pytest.raises(UserError, match="3 rows cannot be split over 4 ranks with drop_remainder=True"):
        shard_indices(3, 0, 4, drop_remainder=True)


@pytest.mark.parametrize("length, size", [(10, 4), (8, 4), (3, 4), (1025, 2)])
def test_take_shard_matches_the_indices_for_arrays_and_lists(length, size):
    x = np.arange(length) * 10
    for rank in range(size):
        expected = [int(v) for v in x[shard_indices(length, rank, size)]]
        assert [int(v) for v in take_shard(x, rank, size)] == expected
        assert take_shard(list(x), rank, size) == list(x[shard_indices(length, rank, size)])


def test_an_unpadded_numpy_shard_is_a_view():
    x = np.arange(12)
    assert np.shares_memory(take_shard(x, 1, 4), x)


def test_arrays_are_sharded_together_and_must_have_the_same_length():
    x, y = np.arange(10), np.arange(10) * 2
    xs, ys = shard_together((x, y), 2, 4)
    assert list(ys) == [2 * v for v in xs] and len(xs) == 3
    assert list(shard_together((x,), 2, 4)) == list(xs)
    with pytest.raises(UserError, match=r"arrays have different lengths \[9, 10\]"):
        shard_together((x, y[:9]), 0, 2)


@pytest.mark.parametrize("n, before, after, batch", [(400, 2, 3, 10), (400, 2, 1, 10), (401, 3, 2, 7), (10, 4, 3, 1)])
def test_a_position_of_one_world_size_resumes_on_another_with_every_row_once(n, before, after, batch):
    from hvdkit.runtime.sharding import resume_indices

    order = [(i * 7919) % n for i in range(n)]        # a fixed permutation (n and 7919 are coprime)
    k = (n // (batch * before)) // 2                   # stopped half-way through the epoch
    seen = [i for r in range(before) for i in resume_indices(order, 0, r, before)[:k * batch]]
    start = k * batch * before                          # what the sampler's position() stores
    rest = [i for r in range(after) for i in resume_indices(order, start, r, after)]
    assert sorted(seen) == sorted(order[:start])
    assert sorted(set(seen + rest)) == list(range(n))
    assert len(seen) + len(rest) - n < after, "only the padding of the last round repeats rows"


def test_resume_indices_pads_like_distributed_sampler_and_drops_with_drop_last():
    from hvdkit.runtime.sharding import resume_indices

    assert [resume_indices(list(range(10)), 6, r, 3) for r in range(3)] == [[6, 9], [7, 0], [8, 1]]
    assert [resume_indices(list(range(10)), 6, r, 3, drop_last=True) for r in range(3)] == [[6], [7], [8]]
    assert resume_indices(list(range(10)), 12, 0, 3) == []


def test_samples_done_is_the_jobs_count_capped_at_the_epoch():
    from hvdkit.runtime.sharding import samples_done

    assert samples_done(280, 4, 10, 3, 400) == 400            # 280 + 120, the epoch's end
    assert samples_done(0, 14, 10, 2, 400) == 280
    assert samples_done(0, 3, 3, 3, 10, pass_batches=3) == 10  # a drop_last pass done: the whole epoch
    assert samples_done(0, 1, 3, 3, 10, pass_batches=3) == 9      # mid-pass: batches x batch x ranks
