"""hvdkit.common.launcher: which launcher started a process, read in one place; launches Horovod cannot join stop."""

import re

import pytest

from hvdkit.common.launcher import (
    LauncherError,
    check_joined,
    check_srun_step,
    detect,
    horovodrun_worker_slot,
    slurm_gave_no_gpu,
    slurm_job,
    spans_one_host,
)
from tests.conftest import ROOT

pytestmark = pytest.mark.unit

HOROVODRUN_GLOO = {"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
                   "HOROVOD_HOSTNAME": "b"}
MPIRUN = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
          "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
SRUN = {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"}


@pytest.mark.parametrize("env, expected", [
    ({}, ("none", 0, 1, 0, None, None)),                                               # python train.py
    (HOROVODRUN_GLOO, ("horovodrun", 3, 4, 1, 2, None)),
    (MPIRUN, ("mpirun", 1, 2, 1, 2, None)),
    # horovodrun --mpi: mpirun's variables and horovodrun's controller; the first launcher with a rank wins
    ({**MPIRUN, "HOROVOD_CONTROLLER": "mpi"}, ("mpirun", 1, 2, 1, 2, None)),
    ({**MPIRUN, "K_MPI_JOB_ROLE": "worker"}, ("mpi-operator", 1, 2, 1, 2, None)),     # the MPI Operator's pods
    ({**SRUN, "PMIX_RANK": "1", "SLURM_LOCALID": "0", "SLURM_STEP_NUM_NODES": "2"}, ("srun", 1, 2, 0, None, 2)),
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}, ("mpiexec", 2, 4, 0, 1, None)),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, ("torchrun", 1, 2, 1, 2, None)),
    # torchrun's workers inside an srun task inherit PMIX_RANK: the nearer launcher is torchrun
    ({**SRUN, "PMIX_RANK": "0", "SLURM_LOCALID": "0", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3",
      "LOCAL_WORLD_SIZE": "4"}, ("torchrun", 3, 4, 3, 4, None)),
    # a script's own RANK variable is not torchrun (it sets LOCAL_WORLD_SIZE too)
    ({**SRUN, "PMIX_RANK": "1", "SLURM_LOCALID": "1", "RANK": "7"}, ("srun", 1, 2, 1, None, None)),
])
def test_each_launcher_is_read_from_its_own_variables(env, expected):
    place = detect(env)
    assert (place.launcher, place.rank, place.size, place.local_rank, place.local_size, place.nodes) == expected


@pytest.mark.parametrize("env, one_host", [
    ({}, True),                                                                            # python train.py
    ({**MPIRUN}, True),                                                                    # horovodrun -H localhost:2
    ({**MPIRUN, "OMPI_COMM_WORLD_SIZE": "4"}, False),                                      # -H a:2,b:2
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_SIZE": "1"}, False),         # --gloo on 4 hosts
    ({**SRUN, "PMIX_RANK": "0", "SLURM_STEP_NUM_NODES": "2", "SLURM_NNODES": "2"}, False),  # srun --mpi=pmix
    ({**SRUN, "PMIX_RANK": "0", "SLURM_STEP_NUM_NODES": "1", "SLURM_NNODES": "2"}, True),
    ({"SLURM_NNODES": "2"}, True),             # in an allocation but not in a step: this process runs alone
])
def test_whether_every_rank_is_on_this_host(env, one_host):
    assert spans_one_host(env) is one_host


@pytest.mark.parametrize("env,variable", [
    ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}, "WORLD_SIZE=2"),
    ({"OMPI_COMM_WORLD_SIZE": "4"}, "OMPI_COMM_WORLD_SIZE=4"),
    ({"PMI_SIZE": "3"}, "PMI_SIZE=3"),
])
def test_a_launcher_of_several_processes_with_horovod_size_1_raises_naming_horovodrun(env, variable):
    with pytest.raises(LauncherError) as err:
        check_joined(env, size=1, script="mnist.py")
    n = variable.split("=")[1]
    assert str(err.value).startswith(variable) and f"horovodrun -np {n} python mnist.py" in str(err.value)


@pytest.mark.parametrize("env,size", [
    ({}, 1),                                                     # python train.py
    ({"WORLD_SIZE": "1"}, 1),                                    # torchrun --nproc_per_node 1
    ({"HOROVOD_SIZE": "2", "HOROVOD_RANK": "0"}, 2),             # horovodrun --gloo
    ({"OMPI_COMM_WORLD_SIZE": "2", "HOROVOD_SIZE": "2"}, 2),     # horovodrun --mpi / mpirun
    ({"WORLD_SIZE": "8", "HOROVOD_SIZE": "2"}, 2),               # horovodrun inside an outer job's pod
])
def test_jobs_horovod_joined_pass(env, size):
    check_joined(env, size=size)


@pytest.mark.parametrize("env,mpi_built,needle", [
    ({}, True, None),                                                  # not under Slurm
    ({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2"}, True, None),          # the batch script, not a step
    ({**SRUN, "SLURM_NTASKS": "1"}, True, None),                       # one task: a singleton is right
    ({**SRUN, "PMIX_RANK": "0"}, True, None),                          # srun --mpi=pmix
    ({**SRUN, "HOROVOD_RANK": "0"}, False, None),                      # horovodrun inside the allocation
    ({**SRUN, "OMPI_COMM_WORLD_RANK": "0"}, True, None),               # mpirun inside the allocation
    (SRUN, True, "srun --mpi=pmix"),                                   # srun --mpi=none
    ({**SRUN, "PMIX_RANK": "0", "HOROVOD_CONTROLLER": "gloo"}, True, "cannot start a Gloo job"),
    ({**SRUN, "PMIX_RANK": "0"}, False, "cannot start a Gloo job"),   # a Horovod without MPI
])
def test_an_srun_step_horovod_cannot_join_stops_with_the_fix(env, mpi_built, needle):
    if needle is None:
        check_srun_step(env, mpi_built)
        return
    with pytest.raises(LauncherError) as err:
        check_srun_step(env, mpi_built)
    assert needle in str(err.value)


def test_the_slurm_job_is_read_as_slurm_set_it():
    assert slurm_job({}) is None
    job = slurm_job({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)",
                     "SLURM_NTASKS": "4", "SLURM_JOB_GPUS": "0,1"})
    assert (job.job_id, job.nodelist, job.tasks_per_node, job.ntasks, job.gpus) == \
        ("7", "n[1-2]", "2(x2)", 4, "SLURM_JOB_GPUS=0,1")
    assert slurm_job({"SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "0"}).gpus is None       # zero GPUs: none asked
    assert slurm_gave_no_gpu({"SLURM_JOB_ID": "7"})
    assert not slurm_gave_no_gpu({"SLURM_JOB_ID": "7", "SLURM_STEP_GPUS": "2"})
    assert not slurm_gave_no_gpu({"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "0"})
    assert not slurm_gave_no_gpu({})


def test_an_elastic_workers_slot_is_read_from_horovodruns_command_line():
    cmd = "/bin/sh -c env HOROVOD_HOSTNAME=b HOROVOD_RANK=3 HOROVOD_CROSS_RANK=1 HOROVOD_LOCAL_RANK=1 python t.py"
    assert horovodrun_worker_slot(cmd) == (3, "b", 1)
    assert horovodrun_worker_slot("python t.py") is None


def test_no_other_module_reads_a_launchers_variables():
    """One place: a module that needs the rank, the job's size or the allocation asks this one."""
    names = re.compile(r"OMPI_COMM_WORLD|SLURM_|HOROVOD_(LOCAL_)?(RANK|SIZE)|PMIX?_(RANK|SIZE)|\bWORLD_SIZE\b")
    readers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "hvdkit").rglob("*.py")
                     if names.search(p.read_text()))
    assert readers == ["hvdkit/common/launcher.py"]
