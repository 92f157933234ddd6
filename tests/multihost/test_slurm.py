"""The PyTorch example under a real Slurm cluster on two test hosts (2 nodes x 2 tasks), both ways a user
launches it there: `srun --mpi=pmix` directly (no ssh, no horovodrun) and `hvdkit launch` inside the
allocation (hosts read from SLURM_JOB_NODELIST / SLURM_TASKS_PER_NODE). Each must give the world size 4,
both hosts, and the same test accuracy as 4 MPI processes on one host."""

import re
import shutil
import sys

import pytest

from tests.conftest import BIN, ROOT, job_env, run_job
from tests.multihost.conftest import require_root
from tests.multihost.slurm_cluster import SlurmHosts
from tests.multihost.test_multihost import DETERMINISTIC, result_of
from tests.multihost.testhosts import PORT

pytestmark = pytest.mark.multihost
EXAMPLE = f"{sys.executable} {ROOT / 'examples' / 'pytorch_mnist.py'} --epochs 4 --json"
@pytest.fixture(scope="module")
def slurm():
    require_root()
    for tool in ("slurmctld", "slurmd", "sbatch", "srun"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: scripts/install.sh installs slurm-wlm for the multi-host tier")
    with SlurmHosts(["hosta", "hostb"]) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def one_host_mpi():
    """4 MPI processes on one host: the reference (the Slurm paths both use MPI)."""
    proc = run_job([str(BIN / "horovodrun"), "-np", "4", "-H", "localhost:4", "--mpi", *EXAMPLE.split()],
                   timeout=300, env=job_env(**DETERMINISTIC))
    assert proc.returncode == 0, proc.stdout[-3000:]
    return result_of(proc.stdout)


def run_batch(slurm, body: str) -> str:
    script = (f"cd {ROOT}\nexport HOROVOD_FUSION_THRESHOLD=0 TF_CPP_MIN_LOG_LEVEL=3 PATH={BIN}:$PATH\n"
              "srun --mpi=none hostname | sort | uniq -c\n" + body + "\n")
    job, output = slurm.sbatch(script, nodes=2, tasks_per_node=2)
    state, text = slurm.wait(job, output, timeout=300)
    assert state == "COMPLETED", f"job {job} ended {state}:\n{text[-3000:]}\n{slurm.logs()}"
    assert re.search(r"^\s*2 hosta$", text, re.M) and re.search(r"^\s*2 hostb$", text, re.M), text[:500]
    return text


def test_srun_direct_launch_on_two_hosts(slurm, one_host_mpi):
    text = run_batch(slurm, f"srun --mpi=pmix {EXAMPLE}")
    result = result_of(text)
    assert result["size"] == 4 and result["hosts"] == 2
    assert result["test_accuracy"] == one_host_mpi["test_accuracy"]
    assert result["test_loss"] == pytest.approx(one_host_mpi["test_loss"], rel=1e-6)


def test_hvdkit_launch_inside_the_allocation(slurm, one_host_mpi):
    text = run_batch(slurm, f"{BIN / 'hvdkit'} launch -p {PORT} --network-interface eth0 --mpi -- {EXAMPLE}")
    assert f"-np 4 -H hosta:2,hostb:2 --mpi -p {PORT}" in text, text[-3000:]
    result = result_of(text)
    assert result["size"] == 4 and result["hosts"] == 2
    assert result["test_accuracy"] == one_host_mpi["test_accuracy"]


def test_srun_without_pmix_stops_with_the_fix(slurm):
    script = f"cd {ROOT}\nexport TF_CPP_MIN_LOG_LEVEL=3\nsrun --mpi=none {EXAMPLE}\n"
    job, output = slurm.sbatch(script, nodes=2, tasks_per_node=2)
    state, text = slurm.wait(job, output, timeout=120)
    assert state == "FAILED", text[-3000:]
    assert "srun started 4 tasks without an MPI plugin" in text and "srun --mpi=pmix" in text, text[-3000:]
