"""/dev/shm's size, read through a fake statvfs, and the one line hk.init() and hvdkit doctor print for a GPU host
whose /dev/shm is too small for NCCL (a plain `docker run` gives 64 MiB); CPU hosts are never warned."""

import os

import pytest

from hvdkit.common.shared_memory import NCCL_SHM_BYTES, SHM_PATH, shm_bytes, small_shm_warning
from hvdkit.ops.doctor import DoctorReport, render, shm_warnings
from hvdkit.ops.envreport import EnvReport

pytestmark = pytest.mark.unit
DOCKER_DEFAULT = 64 << 20


def fake_statvfs(size: int, frsize: int = 4096):
    asked = []

    def statvfs(path):
        asked.append(path)
        # (bsize, frsize, blocks, bfree, bavail, files, ffree, favail, flag, namemax)
        return os.statvfs_result((frsize, frsize, size // frsize, size // frsize, size // frsize, 0, 0, 0, 0, 255))
    return statvfs, asked


def test_the_size_is_fragment_size_times_blocks_of_dev_shm():
    statvfs, asked = fake_statvfs(DOCKER_DEFAULT)
    assert shm_bytes(statvfs) == DOCKER_DEFAULT and asked == [SHM_PATH]
    assert shm_bytes(fake_statvfs(8 << 30, frsize=1024)[0]) == 8 << 30


def test_no_dev_shm_is_an_unknown_size_not_an_error():
    def missing(path):
        raise FileNotFoundError(path)
    assert shm_bytes(missing) is None
    assert small_shm_warning(None) is None


def test_dockers_default_64_mib_warns_in_one_line_naming_the_fix():
    line = small_shm_warning(DOCKER_DEFAULT)
    assert line.startswith("hvdkit: /dev/shm is 64 MiB, less than the 1 GiB") and "\n" not in line
    assert "--ipc=host" in line and "--shm-size=1g" in line
    assert small_shm_warning(DOCKER_DEFAULT, "gpu01").startswith("hvdkit: /dev/shm on gpu01 is 64 MiB")


@pytest.mark.parametrize("size", [NCCL_SHM_BYTES, 8 << 30])
def test_1_gib_or_more_is_enough(size):
    assert small_shm_warning(size) is None


def report(gpus: list[str], shm: int | None) -> EnvReport:
    return EnvReport(hvdkit="0.1.0", python="3.11.7", python_executable="/x/python", platform="Linux",
                     packages={}, torch_cuda=None, horovod=None, horovod_error=None, mpi=None, gpus=gpus,
                     shm_bytes=shm)


def test_doctor_warns_for_gpu_hosts_with_a_small_dev_shm_only():
    reports = {"gpu01": report(["NVIDIA H100"], DOCKER_DEFAULT), "gpu02": report(["NVIDIA H100"], 8 << 30),
               "cpu01": report([], DOCKER_DEFAULT), "old": report(["NVIDIA H100"], None)}   # old: an hvdkit without it
    warnings = shm_warnings(reports)
    assert warnings == [small_shm_warning(DOCKER_DEFAULT, "gpu01")]
    text = render(DoctorReport(warnings=warnings))
    assert [line for line in text.splitlines() if line.startswith("hvdkit:")] == warnings
    assert DoctorReport(warnings=warnings).to_dict()["warnings"] == warnings


def test_an_env_report_from_a_host_without_the_field_reads_as_unknown():
    data = report([], None).to_dict()
    del data["shm_bytes"]
    assert EnvReport.from_dict(data).shm_bytes is None
