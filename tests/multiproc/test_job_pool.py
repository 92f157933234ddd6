"""The test job pools themselves (tests/job_pool.py), under both controllers: one job serves many scenarios, and a
scenario that one rank fails ends with that rank's exit code, as a job of its own would, not in a timeout."""

import time

import pytest

from tests.conftest import WORKERS, read_rank_results, run_horovodrun
from tests.job_pool import FAILED_RANK_GRACE, POOLS

pytestmark = pytest.mark.multiproc
WORKER = str(WORKERS / "torch_pool_probe.py")
TAG = {"gloo": "[1]", "mpi": "[1,1]"}          # how each controller tags rank 1's lines


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_one_job_runs_scenario_after_scenario_each_with_horovod_initialised_afresh(tmp_path, controller):
    # Open MPI cannot initialise twice in a process: an MPI pool rank initialises it once (mpi4py), so Horovod's
    # shutdown after a scenario leaves it up; without that the second hk.init would end the pool.
    started = POOLS.started
    pids = []
    for n in range(3):
        out = tmp_path / str(n)
        out.mkdir()
        proc = run_horovodrun(2, [WORKER, "--out", str(out)], controller, timeout=180, pool="torch")
        assert proc.returncode == 0, proc.stdout[-3000:]
        results = read_rank_results(out, 2, proc.stdout)
        on_mpi = controller == "mpi"
        assert [(r["size"], r["total"], r["mpi"], r["gloo"]) for r in results] == [(2, 3.0, on_mpi, not on_mpi)] * 2
        pids.append(sorted(r["pid"] for r in results))
    assert pids[0] == pids[1] == pids[2], pids             # the same two processes served all three
    assert POOLS.started - started <= 1                     # at most one new pool (an earlier test's may serve)


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_a_rank_failing_before_init_ends_its_scenario_with_its_exit_code_not_a_timeout(tmp_path, controller):
    # Under MPI its peer waits in hk.init's MPI_Comm_dup, which has no timeout: the scenario waited out the test's
    # whole timeout and was reported as timed out, where a job of its own ends as mpirun sees rank 1 exit 3.
    began = time.monotonic()
    proc = run_horovodrun(2, [WORKER, "--out", str(tmp_path), "--fail-rank", "1"], controller, timeout=240,
                          pool="torch")
    took = time.monotonic() - began
    assert proc.returncode == 3, proc.stdout[-3000:]
    assert f"{TAG[controller]}<stderr>:rank 1 fails before hk.init" in proc.stdout, proc.stdout[-3000:]
    assert took < FAILED_RANK_GRACE + 120, took     # a pool's start (up to a minute on a busy 2 cores) and the grace
    # The next scenario gets a pool that works.
    proc = run_horovodrun(2, [WORKER, "--out", str(tmp_path)], controller, timeout=180, pool="torch")
    assert proc.returncode == 0 and read_rank_results(tmp_path, 2, proc.stdout)[0]["total"] == 3.0, proc.stdout

