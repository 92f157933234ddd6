"""Horovod really runs: 2 processes under horovodrun (Gloo and MPI) and plain mpirun, torch and TF."""

import pytest

pytestmark = pytest.mark.multiproc


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
@pytest.mark.parametrize("controller", ["gloo", "mpi", "mpirun"])
def test_two_process_collectives(launch, framework, controller):
    results = launch(2, "allreduce.py", "--framework", framework, controller=controller)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 and r["local_size"] == 2 for r in results)
    assert len({r["pid"] for r in results}) == 2, "both ranks must be separate processes"
    # The controller asked for is the one Horovod used.
    uses_mpi = controller in ("mpi", "mpirun")
    assert all(r["mpi_enabled"] == uses_mpi and r["gloo_enabled"] == (not uses_mpi) for r in results)
    for r in results:
        assert r["avg_ok"], f"rank {r['rank']}: Average allreduce is wrong"
        assert r["sum_ok"], f"rank {r['rank']}: Sum allreduce is wrong"
        assert r["bcast"] == [0.0] * 4, "broadcast must carry rank 0's value"
        assert r["gathered"] == [0, 1]
