"""hvdkit.core.context.check_launcher: several processes that Horovod did not join are stopped at init."""

import pytest

from hvdkit.core.context import LauncherError, check_launcher

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("env,variable", [
    ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}, "WORLD_SIZE=2"),
    ({"OMPI_COMM_WORLD_SIZE": "4"}, "OMPI_COMM_WORLD_SIZE=4"),
    ({"PMI_SIZE": "3"}, "PMI_SIZE=3"),
])
def test_a_launcher_of_several_processes_with_horovod_size_1_raises_naming_horovodrun(env, variable):
    with pytest.raises(LauncherError) as err:
        check_launcher(env, size=1, script="mnist.py")
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
    check_launcher(env, size=size)
