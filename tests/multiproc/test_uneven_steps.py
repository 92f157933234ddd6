"""Ranks that would run different numbers of steps: hvdkit's sharding gives every rank the same count, and a
job whose ranks disagree anyway ends with the ranks named instead of waiting forever; a rank that is only
slow is left alone."""

import re
import time

import pytest

from tests.conftest import ROOT, WORKERS, horovodrun_cmd, hvdkit_launch_cmd, job_env, read_rank_results, run_job

pytestmark = pytest.mark.multiproc
WORKER = str(WORKERS / "uneven_steps.py")
CHECK_S = 2          # HOROVOD_STALL_CHECK_TIME_SECONDS for these jobs (Horovod's default is 60)


def test_keras_shard_arrays_gives_every_rank_the_same_batches(tmp_path):
    """Before: 1025 rows on 2 ranks at batch 32 was 17 batches on rank 0 and 16 on rank 1, and fit hung; so did
    257 rows at batch 128. (The example below, on 3 ranks, deals with hk.distributed_batches since issue 34,
    which pads the same way, through hvdkit.runtime.sharding.)"""
    pairs = [(1025, 32), (257, 128)]
    proc = run_job(horovodrun_cmd(2, [WORKER, "--out", str(tmp_path), "--case", "keras-shard",
                                      "--rows", *(str(r) for r, _ in pairs), "--batch", *(str(b) for _, b in pairs)]),
                   timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:]
    results = read_rank_results(tmp_path, 2, proc.stdout)
    assert {r["size"] for r in results} == {2}
    assert results[0]["runs"] == results[1]["runs"], results
    assert [run["rows"] for run in results[0]["runs"]] == [513, 129]      # padded up, as DistributedSampler pads


def test_the_keras_example_at_an_uneven_batch_size_on_3_ranks(tmp_path):
    """The issue's reproduction, as a user runs it: examples/keras_mnist.py --batch-size 479 on -np 3."""
    example = str(ROOT / "examples" / "keras_mnist.py")
    proc = run_job(horovodrun_cmd(3, [example, "--dataset", "digits", "--batch-size", "479", "--epochs", "2"]),
                   timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "on 3 processes" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_ranks_that_ran_different_steps_end_with_the_ranks_named(tmp_path, controller):
    """Before: under MPI Horovod warned "One or more tensors were submitted ... by subset of ranks" every check,
    forever; under Gloo it printed nothing at all (its stall inspector saw no ranks) and hung."""
    env = job_env(HOROVOD_STALL_CHECK_TIME_SECONDS=str(CHECK_S))
    start = time.time()
    proc = run_job(hvdkit_launch_cmd(2, [WORKER, "--out", str(tmp_path), "--case", "torch-extra"], controller),
                   timeout=120, env=env)
    took = time.time() - start
    assert proc.returncode != 0, proc.stdout[-3000:]
    results = read_rank_results(tmp_path, 2, proc.stdout)
    assert all(r["size"] == 2 and "Horovod has been shut down" in r["error"] for r in results), results
    line = proc.stdout.strip().splitlines()[-1]
    # Rank 0 waits in its extra step's gradients: which of them are still pending when the stall check looks
    # depends on the timing (the response cache, the cycle), so any of the model's layers (bn in most runs).
    assert re.search(r"hvdkit launch: job failed: the ranks deadlocked: every rank is waiting in a collective "
                     r"that another rank never joined.* rank 0 waits in \[allreduce\.(conv|bn|fc)\.[^]]*\]; "
                     r"rank 1 waits in \[allreduce\.accuracy\]; .*different number of batches", line), line
    # Found within a few stall checks (cached tensors need one more check), not after minutes.
    assert took < 60, f"the deadlock took {took:.0f}s to end"


def test_a_rank_that_is_only_slow_is_not_taken_for_a_deadlock(tmp_path):
    """Rank 0 spends 4 stall-check periods outside any collective (as a long evaluation would) between two steps,
    while rank 1 waits in the next allreduce: the job must finish."""
    env = job_env(HOROVOD_STALL_CHECK_TIME_SECONDS=str(CHECK_S))
    proc = run_job(horovodrun_cmd(2, [WORKER, "--out", str(tmp_path), "--case", "torch-slow",
                                      "--sleep", str(4 * CHECK_S)]), timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    results = read_rank_results(tmp_path, 2, proc.stdout)
    assert all(r["size"] == 2 and r["steps"] == 5 for r in results)
    assert results[1]["seconds"] > 4 * CHECK_S * 0.9, "rank 1 did not wait for the slow rank"
    assert "Deadlock" not in proc.stdout
