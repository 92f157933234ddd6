"""Every rank gets the same number of rows, so every rank runs the same number of steps."""

import math

import numpy as np
import pytest

from hvdkit.core.errors import UserError
from hvdkit.core.sharding import shard_indices, shard_together, take_shard

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
    with pytest.raises(ValueError, match=r"arrays have different lengths \[9, 10\]"):
        shard_together((x, y[:9]), 0, 2)
