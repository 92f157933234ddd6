"""ResumableDistributedSampler: shards, per-epoch shuffles and mid-epoch resume; shard_arrays (no processes)."""

import pytest

from hvdkit.torch.data import ResumableDistributedSampler, ShardSampler

pytestmark = pytest.mark.adapters


def sampler(rank, size=2, n=21, batch=4):
    return ResumableDistributedSampler(list(range(n)), num_replicas=size, rank=rank, shuffle=True,
                                       seed=5, drop_last=False, batch_size=batch)


def test_shards_cover_the_data_and_reshuffle_each_epoch():
    s0, s1 = sampler(0), sampler(1)
    for s in (s0, s1):
        s.set_epoch(0)
    epoch0 = list(s0) + list(s1)
    assert set(epoch0) == set(range(21)) and len(epoch0) == 22   # padded by one for equal shards
    s0.set_epoch(1)
    assert list(s0) != epoch0[:11]


def test_resume_mid_epoch_continues_where_it_stopped():
    full = sampler(1)
    full.set_epoch(3)
    order = list(full)
    resumed = sampler(1)
    resumed.set_epoch(3, start_batch=2)
    assert list(resumed) == order[8:] and len(resumed) == len(order) - 8
    resumed.set_epoch(4)                      # the next epoch starts from its beginning again
    assert len(list(resumed)) == len(order)


def test_eval_shards_are_unpadded_and_disjoint():
    shards = [list(ShardSampler(21, r, 2)) for r in range(2)]
    assert sorted(shards[0] + shards[1]) == list(range(21))


def test_a_third_pass_since_set_epoch_is_warned_about_once(caplog):
    """Train, then evaluate on the training data: two passes per epoch are fine; a third means set_epoch was
    forgotten (or called only once, before the loop)."""
    s = sampler(0)
    s.set_epoch(0)
    first = list(s)

    def warnings():
        return [r.getMessage() for r in caplog.records if r.name == "hvdkit.torch"]

    with caplog.at_level("WARNING", logger="hvdkit.torch"):
        assert list(s) == first               # what the warning is about: the same order again
        assert warnings() == []               # the second pass: an evaluation on the training data
        list(s)
        assert len(warnings()) == 1           # the third
        list(s)
    assert len(warnings()) == 1, warnings()   # once
    assert warnings()[0].startswith("hvdkit: ") and "train_loader.sampler.set_epoch(epoch)" in warnings()[0]


def test_a_loop_that_never_calls_set_epoch_is_warned_about_at_its_second_pass(caplog):
    s = sampler(0)
    with caplog.at_level("WARNING", logger="hvdkit.torch"):
        list(s)
        assert not caplog.records
        list(s)
    assert len([r for r in caplog.records if r.name == "hvdkit.torch"]) == 1


def test_evaluating_on_the_training_data_each_epoch_is_not_warned_about(caplog):
    """set_epoch each epoch, then a second pass (training accuracy): the order is new every epoch."""
    s = sampler(0)
    with caplog.at_level("WARNING", logger="hvdkit.torch"):
        for epoch in range(3):
            s.set_epoch(epoch)
            list(s)                           # train
            list(s)                           # evaluate on the training data
    assert not [r for r in caplog.records if r.name == "hvdkit.torch"]


def test_set_epoch_between_epochs_and_unshuffled_samplers_are_not_warned_about(caplog):
    s = sampler(0)
    plain = ResumableDistributedSampler(list(range(21)), num_replicas=2, rank=0, shuffle=False, seed=5,
                                        drop_last=False, batch_size=4)
    with caplog.at_level("WARNING", logger="hvdkit.torch"):
        for epoch in range(3):
            s.set_epoch(epoch)
            list(s)
            list(plain)                       # no shuffle: the same order every epoch is what was asked for
    assert not [r for r in caplog.records if r.name == "hvdkit.torch"]


@pytest.mark.parametrize("rows, size", [(1025, 2), (1437, 3), (10, 4), (8, 8)])
def test_shard_arrays_gives_every_rank_the_same_rows_of_tensors(monkeypatch, rows, size):
    """docs/ADAPTERS.md, data that is not a DataLoader: equal counts, so equal steps; every row on some rank."""
    from types import SimpleNamespace

    import torch

    import hvdkit.torch.data as data

    x, y = torch.arange(rows * 2).reshape(rows, 2), torch.arange(rows)
    shards = []
    for rank in range(size):
        monkeypatch.setattr(data, "current", lambda rank=rank: SimpleNamespace(rank=rank, size=size))
        shards.append(data.shard_arrays(x, y))
    assert {len(sx) for sx, _ in shards} == {len(sy) for _, sy in shards} == {-(-rows // size)}
    assert set(torch.cat([sy for _, sy in shards]).tolist()) == set(range(rows))
    assert all(torch.equal(sx[:, 1] // 2, sy) for sx, sy in shards), "rows of x and y stay paired"


def test_an_evaluation_pass_leaves_torchs_global_generator_alone():
    # A resumed job that skips an epoch-end evaluation (preempted on the epoch's last batch) must draw the same
    # dropout masks afterwards as the uninterrupted run: the eval loader may not take from the global generator.
    # In a subprocess: hk.init() here would set Horovod's defaults and MPI's variables in pytest's environment,
    # which every later job inherits.
    import subprocess
    import sys

    from tests.conftest import ROOT, job_env

    code = ("import torch, hvdkit.torch as hk; hk.init(); loader = hk.eval_loader(list(range(10)), batch_size=4)\n"
            "torch.manual_seed(0); expected = torch.rand(3)\n"
            "torch.manual_seed(0)\n"
            "for _ in loader: pass\n"
            "print('unchanged' if torch.equal(torch.rand(3), expected) else 'advanced')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=job_env(),
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "unchanged"
