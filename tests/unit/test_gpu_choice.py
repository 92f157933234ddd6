"""Which GPU each rank pins, and when it must stop: runtime.topology's rule and runtime.cuda_driver's checks.

The rule sees what the ranks exchange (GPUView: host, local rank, visible
UUIDs); the driver check sees a fake /dev and /proc in tmp_path.
"""

import ctypes

import pytest

from hvdkit.runtime import cuda_driver
from hvdkit.runtime.topology import GPUView, NoGPUError, check_gpu_choice, hides_all_gpus, loader_workers, pin_gpu

pytestmark = pytest.mark.unit


def uuid(c: str) -> str:
    return f"GPU-{c * 8}-{c * 4}-{c * 4}-{c * 4}-{c * 12}"


def host(*seen: str, cvd=None, name="n1") -> list[GPUView]:
    """One host's ranks: rank i sees the GPUs named by the letters of seen[i]; cvd, one per rank or shared."""
    cvds = cvd if isinstance(cvd, list) else [cvd] * len(seen)
    return [GPUView(i, name, i, len(seen), tuple(uuid(c) for c in letters), cvds[i])
            for i, letters in enumerate(seen)]


def choices(views: list[GPUView]) -> list[int]:
    return [check_gpu_choice(views, v.rank) for v in views]


# 1. The launcher gave each rank its own GPU(s): every rank pins its first.
@pytest.mark.parametrize("seen,cvd", [
    (["a", "b"], "0"),                        # Slurm with cgroups: CUDA_VISIBLE_DEVICES=0 everywhere
    (["a", "b", "c", "d"], ["0", "1", "2", "3"]),   # Slurm without cgroups, or a per-rank export
    (["ab", "cd", "ef", "gh"], ["0,1", "2,3", "4,5", "6,7"]),   # two GPUs per rank: the first of each
])
def test_a_gpu_per_rank_pins_the_first(seen, cvd):
    assert choices(host(*seen, cvd=cvd)) == [0] * len(seen)


# 2. Every rank sees all of the host's GPUs: local rank N pins GPU N.
@pytest.mark.parametrize("seen", [["ab", "ab"], ["abcd"] * 4, ["abcdefgh"] * 4])
def test_all_gpus_visible_pins_the_local_rank(seen):
    assert choices(host(*seen)) == list(range(len(seen)))


@pytest.mark.parametrize("ranks,gpus,cvd", [(2, "a", None), (4, "ab", "4,5"), (3, "ab", None)])
def test_more_ranks_than_visible_gpus_gets_the_slots_error_on_the_extra_ranks(ranks, gpus, cvd):
    views = host(*[gpus] * ranks, cvd=cvd)
    for v in views[:len(gpus)]:
        assert check_gpu_choice(views, v.rank) in range(len(gpus))   # the extra ranks stop the job
    for v in views[len(gpus):]:
        with pytest.raises(NoGPUError) as err:
            check_gpu_choice(views, v.rank)
        assert str(err.value) == (
            f"local rank {v.local_rank} has no GPU: this host runs {ranks} processes but {len(gpus)} GPU(s) are "
            f"visible (CUDA_VISIBLE_DEVICES={cvd or 'unset'}); lower the host's slots to {len(gpus)} in "
            f"-H/--hostfile or expose more GPUs")


# 3. Two ranks would take the same physical GPU.
def test_ranks_sharing_a_gpu_get_one_line_naming_them_and_the_fix():
    views = host("ab", "a", cvd=["0,1", "0"])     # rank 0 sees the host, rank 1 was shown only GPU a
    for v in views:
        with pytest.raises(NoGPUError) as err:
            check_gpu_choice(views, v.rank)
        assert str(err.value) == (
            f"ranks 0 and 1 on n1 would share GPU {uuid('a')} (rank 0 (local rank 0) takes GPU 0 of the 2 it sees "
            "with CUDA_VISIBLE_DEVICES=0,1; rank 1 (local rank 1) takes GPU 0 of the 1 it sees with "
            "CUDA_VISIBLE_DEVICES=0): give each rank its own GPU (srun --gpus-per-task=1, or a different "
            "CUDA_VISIBLE_DEVICES per rank) or show every rank all of the host's GPUs, and hvdkit pins one per "
            "local rank")


def test_each_rank_names_only_the_ranks_on_its_own_gpu():
    views = host("a", "a", "b", "b", cvd=["0", "0", "1", "1"])   # CUDA_VISIBLE_DEVICES=$((LOCAL_RANK / 2))
    for v in views:
        with pytest.raises(NoGPUError, match="ranks 0 and 1 on n1 would share GPU GPU-aaaa" if v.rank < 2
                           else "ranks 2 and 3 on n1 would share GPU GPU-bbbb"):
            check_gpu_choice(views, v.rank)


def test_sharing_is_caught_across_horovod_hosts_with_one_host_name():
    # -H localhost:1,127.0.0.1:1: two Horovod "hosts", each rank local rank 0, one machine and one GPU 0.
    views = [GPUView(0, "n1", 0, 1, (uuid("a"), uuid("b"))), GPUView(1, "n1", 0, 1, (uuid("a"), uuid("b")))]
    with pytest.raises(NoGPUError, match="ranks 0 and 1 on n1 would share"):
        check_gpu_choice(views, 1)


def test_only_the_ranks_own_host_and_its_gpu_ranks_count():
    views = host("a", "b", cvd="0") + [GPUView(2, "n2", 0, 2, (uuid("c"),), "0"), GPUView(3, "n2", 1, 2, (), "")]
    # Rank 2 shares nothing with n1's ranks; rank 3 chose the CPU (empty CUDA_VISIBLE_DEVICES) and pins nothing.
    assert [check_gpu_choice(views, rank) for rank in range(3)] == [0, 0, 0]


def test_torch_and_driver_uuid_spellings_are_one_gpu():
    # torch prints aaaaaaaa-..., the driver library GPU-aaaaaaaa-...: rank 0's first GPU is rank 1's only one.
    views = [GPUView(0, "n1", 0, 2, (uuid("a")[4:], uuid("b")[4:])), GPUView(1, "n1", 1, 2, (uuid("a"),))]
    with pytest.raises(NoGPUError, match="would share GPU GPU-aaaa"):
        check_gpu_choice(views, 0)


# Without UUIDs (a TensorFlow whose CUDA driver library cannot say): CUDA_VISIBLE_DEVICES entries stand in.
def test_without_uuids_distinct_cuda_visible_devices_pass_and_equal_ones_get_the_slots_error():
    distinct = [GPUView(0, "n1", 0, 2, (None,), "0"), GPUView(1, "n1", 1, 2, (None,), "1")]
    assert choices(distinct) == [0, 0]
    assert distinct[0].gpus == ("CUDA_VISIBLE_DEVICES entry 0",)
    alike = [GPUView(0, "n1", 0, 2, (None,), "0"), GPUView(1, "n1", 1, 2, (None,), "0")]   # Slurm cgroups
    with pytest.raises(NoGPUError, match="local rank 1 has no GPU"):
        check_gpu_choice(alike, 1)
    unset = [GPUView(i, "n1", i, 2, (None, None)) for i in range(2)]
    assert choices(unset) == [0, 1]


def test_pin_gpu_checks_before_pinning_unless_told_to_pin_first():
    events, views = [], host("a", "a")     # one GPU, both ranks: rank 1 gets the slots error

    def gather(view):
        events.append("gather")
        return views

    with pytest.raises(NoGPUError):
        pin_gpu(views[1], gather, lambda i: events.append(f"pin {i}"), environ={})
    assert events == ["gather"], "torch must not pin a GPU it has no right to"
    events.clear()
    with pytest.raises(NoGPUError):
        pin_gpu(views[1], gather, lambda i: events.append(f"pin {i}"), pin_first=True, environ={})
    assert events == ["pin 0", "gather"]
    events.clear()
    views = host("ab", "ab")
    assert pin_gpu(views[1], gather, lambda i: events.append(f"pin {i}"), environ={}) == 1
    assert events == ["gather", "pin 1"]


def test_pin_gpu_in_an_elastic_job_exchanges_nothing():
    # A worker that joins later runs init() while the others train: an allgather there would pair with nothing.
    def gather(view):
        raise AssertionError("no collective in an elastic init")

    pinned = []
    assert pin_gpu(host("a", "b")[1], gather, pinned.append, environ={"HOROVOD_ELASTIC": "1"}) == 0
    assert pinned == [0]


@pytest.mark.parametrize("value,hidden", [
    (None, False), ("0", False), ("1,0", False), ("GPU-5a1f", False), ("MIG-1c2d", False),
    ("", True), ("-1", True), ("NoDevFiles", True), (" ", True),
])
def test_cuda_visible_devices_that_hide_every_gpu(value, hidden):
    assert hides_all_gpus(value) is hidden


# 4. GPUs present but CUDA unusable: one line with the driver, the minimum and the fix.
@pytest.fixture
def gpu_host(tmp_path):
    """A fake host: /dev with nvidia0 and nvidiactl, and /proc/driver/nvidia/version saying ``driver``."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()
    (tmp_path / "dev" / "nvidiactl").touch()

    def make(driver: str | None, line="NVRM version: NVIDIA UNIX x86_64 Kernel Module  {}  Sat Aug 19 2023"):
        version = tmp_path / "version"
        if driver is not None:
            version.write_text(line.format(driver) + "\nGCC version:  gcc version 12.2.0\n")
        return dict(dev_dir=str(tmp_path / "dev"), version_file=str(version), environ={}, which=lambda _: None)

    return make


def check(usable=False, framework="torch", cuda_build="13.0", **host):
    cuda_driver.check_cuda_usable(usable, framework, cuda_build, **host)


@pytest.mark.parametrize("driver,framework,build,minimum,major", [
    ("550.54.15", "torch", "13.0", 580, 13),
    ("575.57.08", "torch", "13.0", 580, 13),
    ("520.61.05", "TensorFlow", "12.5.1", 525, 12),
])
def test_a_driver_older_than_the_frameworks_cuda_needs(gpu_host, driver, framework, build, minimum, major):
    with pytest.raises(NoGPUError) as err:
        check(framework=framework, cuda_build=build, **gpu_host(driver))
    assert str(err.value) == (
        f"NVIDIA GPU(s) found ({gpu_host(driver)['dev_dir']}/nvidia0) but {framework} cannot use CUDA: driver "
        f"{driver} is older than {minimum}, the minimum for CUDA {major} ({framework} is built for CUDA {build}); "
        f"upgrade the NVIDIA driver to {minimum} or newer, or set HVDKIT_DEVICE=cpu to train on the CPU "
        f"deliberately")


def test_the_open_kernel_modules_version_line_is_read(gpu_host):
    line = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {}  Release Build  (dvs-builder@U16)"
    assert cuda_driver.driver_version(gpu_host("570.133.20", line)["version_file"]) == "570.133.20"
    with pytest.raises(NoGPUError, match="driver 570.133.20 is older than 580"):
        check(**gpu_host("570.133.20", line))


@pytest.mark.parametrize("driver,needle", [
    (None, "and the driver version is unknown ("),
    ("580.65.06", "although driver 580.65.06 is new enough (580 or newer"),
])
def test_unusable_cuda_with_an_unknown_or_recent_driver_still_names_the_fix(gpu_host, driver, needle):
    with pytest.raises(NoGPUError) as err:
        check(**gpu_host(driver))
    assert needle in str(err.value) and "HVDKIT_DEVICE=cpu" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_cpu_only_build_on_a_gpu_host(gpu_host):
    with pytest.raises(NoGPUError, match="this torch is a CPU-only build; install its CUDA build"):
        check(cuda_build=None, **gpu_host("580.65.06"))


@pytest.mark.parametrize("cvd", ["", "-1"])
def test_the_cpu_chosen_on_purpose_or_usable_cuda_or_no_gpu_is_no_error(gpu_host, tmp_path, cvd):
    host = gpu_host("470.42.01")
    check(**{**host, "environ": {"CUDA_VISIBLE_DEVICES": cvd}})
    check(usable=True, **host)
    (tmp_path / "dev" / "nvidia0").unlink()     # nvidiactl alone is not a GPU
    check(**host)


def test_a_slurm_job_given_no_gpu_is_on_the_cpu_on_purpose(gpu_host):
    host = gpu_host("580.65.06")
    check(**{**host, "environ": {"SLURM_JOB_ID": "7"}})    # cgroups hide the node's GPUs; /dev/nvidia0 remains
    with pytest.raises(NoGPUError, match="although driver 580.65.06 is new enough"):
        check(**{**host, "environ": {"SLURM_JOB_ID": "7", "SLURM_STEP_GPUS": "2"}})


def test_a_visible_devices_value_that_names_no_gpu_is_quoted(gpu_host):
    with pytest.raises(NoGPUError, match=r"but torch cannot use CUDA \(CUDA_VISIBLE_DEVICES=7\)"):
        check(**{**gpu_host("580.65.06"), "environ": {"CUDA_VISIBLE_DEVICES": "7"}})


def test_nvidia_smi_on_path_is_evidence_too(tmp_path):
    which = {"nvidia-smi": "/usr/bin/nvidia-smi"}.get
    assert cuda_driver.gpu_evidence(str(tmp_path / "none"), which) == "nvidia-smi on PATH"
    with pytest.raises(NoGPUError, match=r"NVIDIA GPU\(s\) found \(nvidia-smi on PATH\)"):
        check(dev_dir=str(tmp_path / "none"), version_file=str(tmp_path / "none"), environ={}, which=which)


# TensorFlow's UUIDs come from the CUDA driver library (libcuda), read through ctypes.
class FakeLibcuda:
    def __init__(self, raw: list[bytes], init=0, v2=True):
        self.raw, self.init = raw, init
        if v2:
            self.cuDeviceGetUuid_v2 = self.cuDeviceGetUuid

    def cuInit(self, flags):
        return self.init

    def cuDeviceGetCount(self, count):
        count._obj.value = len(self.raw)
        return 0

    def cuDeviceGet(self, device, ordinal):
        device._obj.value = ordinal
        return 0

    def cuDeviceGetUuid(self, out, device):
        out._obj.bytes[:] = list(self.raw[device.value])
        return 0


def test_visible_gpu_uuids_reads_the_driver_library_in_cuda_order():
    raw = [bytes(range(16)), bytes([0xAB] * 16)]
    assert cuda_driver.visible_gpu_uuids(FakeLibcuda(raw)) == [
        "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f", "GPU-abababab-abab-abab-abab-abababababab"]
    assert cuda_driver.visible_gpu_uuids(FakeLibcuda(raw, v2=False))[0] == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"


def test_visible_gpu_uuids_is_none_when_the_driver_cannot_say(monkeypatch):
    assert cuda_driver.visible_gpu_uuids(FakeLibcuda([bytes(16)], init=100)) is None   # CUDA_ERROR_NO_DEVICE
    monkeypatch.setattr(cuda_driver, "LIBCUDA", "libcuda-not-here.so.1")
    assert cuda_driver.load_libcuda() is None and cuda_driver.visible_gpu_uuids() is None
    assert ctypes.sizeof(cuda_driver._CUuuid) == 16


def test_ranks_without_a_gpu_beside_ranks_with_one_stop_the_whole_job():
    # Host n2's ranks see no GPU and did not hide them (ssh outside Slurm's binding, a lost driver).
    views = host("a", "b") + [GPUView(2, "n2", 0, 2, ()), GPUView(3, "n2", 1, 2, ())]
    for rank in range(4):
        with pytest.raises(NoGPUError, match=r"^ranks 2 and 3 on n2 see no GPU while ranks 0 and 1 on n1 do: .* "
                                             r"check the GPUs and driver on n2 \(nvidia-smi there\)"):
            check_gpu_choice(views, rank)
    # Hidden on purpose (CUDA_VISIBLE_DEVICES=-1 or empty): those ranks train on the CPU.
    hidden = host("a", "b") + [GPUView(2, "n2", 0, 2, (), "-1"), GPUView(3, "n2", 1, 2, (), "")]
    assert [check_gpu_choice(hidden, rank) for rank in range(4)] == [0, 0, None, None]   # a and b: one each
    cpu_only = [GPUView(r, "n1", r, 2, ()) for r in range(2)]
    assert [check_gpu_choice(cpu_only, rank) for rank in range(2)] == [None, None]


def test_pin_gpu_on_a_rank_without_a_gpu_still_joins_the_exchange():
    events = []
    views = [GPUView(0, "n1", 0, 1, ()), GPUView(1, "n2", 0, 1, ())]

    def gather(view):
        events.append("gather")
        return views

    assert pin_gpu(views[0], gather, lambda i: events.append(f"pin {i}"), environ={}) is None
    assert pin_gpu(views[0], gather, lambda i: events.append(f"pin {i}"), pin_first=True, environ={}) is None
    assert events == ["gather", "gather"], "a CPU rank joins the GPU ranks' exchange and pins nothing"


def test_a_cpu_only_tensorflow_is_sent_to_the_tensorflow_gpu_flavour(gpu_host):
    with pytest.raises(NoGPUError) as err:
        check(framework="TensorFlow", cuda_build=None, **gpu_host("580.65.06"))
    assert "use hvdkit's TensorFlow GPU flavour (scripts/install.sh --gpu-tf" in str(err.value)
    assert "FLAVOUR=tensorflow" in str(err.value) and "install its CUDA build" not in str(err.value)


@pytest.mark.parametrize("environ, asked", [
    ({"NVIDIA_VISIBLE_DEVICES": "GPU-5a1f0000-1111-2222-3333-444455556666"}, "NVIDIA_VISIBLE_DEVICES=GPU-5a1f"),
    ({"NVIDIA_VISIBLE_DEVICES": "0,1"}, "NVIDIA_VISIBLE_DEVICES=0,1"),      # a pod's nvidia.com/gpu: 2
])
def test_gpus_asked_for_but_not_injected_stop_instead_of_training_on_the_cpu(gpu_host, tmp_path, environ, asked):
    host = gpu_host("580.65.06")
    (tmp_path / "dev" / "nvidia0").unlink()       # no device was injected (no NVIDIA runtime)
    with pytest.raises(NoGPUError) as err:
        check(**{**host, "environ": environ})
    assert str(err.value).startswith(f"GPUs were asked for ({asked}") and "docker run --gpus all" in str(err.value)
    assert "runtimeClassName: nvidia" in str(err.value) and "\n" not in str(err.value)
    # Hidden on purpose, or nothing asked for (a CUDA base image's NVIDIA_VISIBLE_DEVICES=all): the CPU, no error.
    check(**{**host, "environ": {**environ, "CUDA_VISIBLE_DEVICES": "-1"}})
    for nothing in ("all", "void", "none", ""):
        check(**{**host, "environ": {"NVIDIA_VISIBLE_DEVICES": nothing}})


@pytest.mark.parametrize("value, cpu", [("cpu", True), (" CPU ", True), ("auto", False), ("", False)])
def test_hvdkit_device_chooses_the_cpu_or_names_the_choices(value, cpu):
    from hvdkit.common.errors import UserError
    from hvdkit.runtime.context import chooses_cpu

    assert chooses_cpu({"HVDKIT_DEVICE": value}) is cpu and chooses_cpu({}) is False
    with pytest.raises(UserError, match=r"^HVDKIT_DEVICE='gpu0' is not a device choice: set it to cpu"):
        chooses_cpu({"HVDKIT_DEVICE": "gpu0"})


def test_a_slurm_gpu_job_on_a_node_without_gpus_names_the_node_and_hvdkit_device(gpu_host, tmp_path):
    host = gpu_host("580.65.06")
    (tmp_path / "dev" / "nvidia0").unlink()
    with pytest.raises(NoGPUError) as err:
        check(**{**host, "environ": {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1"}})
    assert str(err.value).startswith("GPUs were asked for (SLURM_JOB_GPUS=0,1) but this node shows none")
    assert "gres.conf" in str(err.value) and "HVDKIT_DEVICE=cpu" in str(err.value) and "docker" not in str(err.value)


@pytest.mark.parametrize("cores, local_size, on_gpu, expected", [
    (16, 1, True, 4),     # the H100 machine of make test-gpu: 4 workers fill the step's input wait
    (64, 8, True, 4),     # 8 GPUs, 8 cores each: at most 4
    (16, 8, True, 1),     # 2 cores per rank: one for the step, one worker
    (8, 8, True, 0),      # 1 core per rank: no room for a worker
    (16, 1, False, 0),    # the CPU: workers would take the step's cores
])
def test_loader_workers_on_a_gpu_leave_the_rank_a_core(monkeypatch, cores, local_size, on_gpu, expected):
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    assert loader_workers(local_size, on_gpu) == expected
