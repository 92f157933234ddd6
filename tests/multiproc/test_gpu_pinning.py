"""GPU pinning for both adapters on a CPU machine: the device queries are faked in the worker, Horovod is real.

Each rank must end up on a GPU of its own, however the launcher shows GPUs:
all of the host's to every rank (pin the local rank: torch set_device(N) and
cuda:N; Keras on TF memory growth and visibility of GPU N only), or one per
rank (Slurm's --gpus-per-task and cgroups, a pod, a per-rank
CUDA_VISIBLE_DEVICES: pin the first). The ranks compare GPU UUIDs: a host with
more processes than GPUs stops every extra rank with the slots message, two
ranks on one physical GPU stop with the sharing message (NCCL would fail
later), and GPUs that CUDA cannot use (an old driver) stop every rank instead
of training on the CPU.
"""

import socket

import pytest

from tests.conftest import WORKERS, horovodrun_cmd, read_rank_results, run_job

pytestmark = pytest.mark.multiproc
# In make test's other lane (tests/conftest.py), which idled 490 s at the end of stop 61's run while this lane
# went past 30 minutes: its jobs are found by their own directories, never by command line.
LANE = "others"
FRAMEWORKS = ["torch", "keras-torch", "keras-tensorflow"]
# Keras on torch pins through torch's calls (set_device), so it runs where the pinning itself is checked; the
# refusals (sharing, slots, no GPU, no NCCL, unusable CUDA, a CPU rank) run on torch and Keras on TensorFlow.
REFUSALS = ["torch", "keras-tensorflow"]


def uuid(c):
    """The UUID the worker gives the GPU it calls ``c`` (as nvidia-smi prints it)."""
    return f"GPU-{c * 8}-{c * 4}-{c * 4}-{c * 4}-{c * 12}"


def pinned(framework, index):
    """The calls that pin GPU ``index`` (of the ones the rank sees)."""
    if framework == "keras-tensorflow":
        gpu = f"/physical_device:GPU:{index}"
        return [["memory_growth", gpu, True], ["visible", gpu, "GPU"]]
    return [["set_device", index]]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_local_rank_pins_its_own_gpu(launch, framework):
    results = launch(2, "gpu_pinning.py", "--framework", framework, "--gpus", "2")
    for rank, r in enumerate(results):
        assert "error" not in r, r
        assert r["size"] == 2 and r["rank"] == rank and r["gpu"] == rank
        # Keras on TF: "/GPU:0" is the only GPU this rank's TensorFlow sees
        assert r["device"] == ("/GPU:0" if framework == "keras-tensorflow" else f"cuda:{rank}")
        assert r["calls"] == pinned(framework, rank)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_gpu_per_rank_from_the_launcher_pins_the_first(launch, framework):
    # Slurm with cgroups: every task has CUDA_VISIBLE_DEVICES=0 and sees one GPU, a different one in each task.
    results = launch(2, "gpu_pinning.py", "--framework", framework, "--uuids", "a", "--uuids", "b",
                     "--cvd", "0", "--cvd", "0")
    for rank, r in enumerate(results):
        assert "error" not in r, r
        assert r["size"] == 2 and r["rank"] == rank and r["gpu"] == 0
        assert r["device"] == ("/GPU:0" if framework == "keras-tensorflow" else "cuda:0")
        assert r["calls"] == pinned(framework, 0)


@pytest.mark.parametrize("framework", REFUSALS)
def test_two_ranks_on_one_physical_gpu_get_the_sharing_error(launch, framework):
    # Rank 0 sees the host's two GPUs and takes its local rank's (a); rank 1 was shown only a, as its first.
    results = launch(2, "gpu_pinning.py", "--framework", framework, "--uuids", "a,b", "--uuids", "a",
                     "--cvd", "0,1", "--cvd", "0", expect_ok=False)
    for rank, r in enumerate(results):
        error = r["error"]
        assert error.startswith(f"ranks 0 and 1 on {socket.gethostname()} would share GPU {uuid('a')} ("), error
        assert "rank 0 (local rank 0) takes GPU 0 of the 2 it sees with CUDA_VISIBLE_DEVICES=0,1" in error
        assert "rank 1 (local rank 1) takes GPU 0 of the 1 it sees with CUDA_VISIBLE_DEVICES=0" in error
        assert "give each rank its own GPU (srun --gpus-per-task=1" in error and "\n" not in error
        # TensorFlow pins before the ranks compare: its collectives start its runtime, which fixes its GPUs.
        assert r["calls"] == (pinned(framework, 0) if framework == "keras-tensorflow" else []), rank


@pytest.mark.parametrize("framework", REFUSALS)
def test_more_processes_than_gpus_gets_the_slots_error(launch, framework):
    # Both ranks see the same one GPU: the host shows all it has, and it has fewer GPUs than processes.
    results = launch(2, "gpu_pinning.py", "--framework", framework, "--gpus", "1", expect_ok=False)
    assert "error" not in results[0] and results[0]["size"] == 2
    error = results[1]["error"]
    assert error.startswith("local rank 1 has no GPU: this host runs 2 processes but 1 GPU(s) are visible"), error
    assert "lower the host's slots to 1" in error
    # Torch checks before it pins; TensorFlow pins first (see the sharing test).
    assert results[1]["calls"] == (pinned(framework, 0) if framework == "keras-tensorflow" else []), \
        "a rank without a GPU must not pin one"


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
@pytest.mark.parametrize("framework", REFUSALS)
def test_a_rank_that_sees_no_gpu_beside_ranks_that_do_stops_every_rank(launch, framework, controller):
    # Rank 1's host shows it no GPU (ranks started over ssh outside Slurm's GPU binding, a lost driver) while
    # rank 0 sees one. Before, rank 1 skipped the ranks' exchange and rank 0 waited in it alone.
    results = launch(2, "gpu_pinning.py", "--framework", framework, "--uuids", "a", "--uuids", "",
                     "--cvd", "0", "--cvd", "unset", controller=controller, expect_ok=False)
    host = socket.gethostname()
    for r in results:
        assert r["error"] == (f"rank 1 on {host} sees no GPU while rank 0 on {host} does: a job runs on GPUs on every "
                              f"host or on none; check the GPUs and driver on {host} (nvidia-smi there) and that "
                              f"the launcher did not hide them, or set HVDKIT_DEVICE=cpu to train on the CPU"), r
    assert results[1]["calls"] == []


@pytest.mark.parametrize("framework", REFUSALS)
def test_a_rank_told_to_use_the_cpu_trains_beside_gpu_ranks(launch, framework):
    # CUDA_VISIBLE_DEVICES=-1 on rank 1: its own choice, not a missing GPU.
    results = launch(2, "gpu_pinning.py", "--framework", framework, "--uuids", "a", "--uuids", "",
                     "--cvd", "0", "--cvd", "-1")
    assert [r["gpu"] for r in results] == [0, None] and results[1]["calls"] == [], results
    assert results[1]["device"] == ("/CPU:0" if framework == "keras-tensorflow" else "cpu")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_hvdkit_device_cpu_trains_on_the_cpu_beside_visible_gpus(launch, framework):
    # A Slurm job given GPUs that trains on the CPU on purpose: Slurm resets CUDA_VISIBLE_DEVICES, this stays.
    # (Set inside the pooled scenario, where hk.init reads it; the launcher passes the environment as any other.)
    results = launch(2, "gpu_pinning.py", "--framework", framework, "--gpus", "2", "--nccl-check", "--device", "cpu")
    for r in results:
        assert "error" not in r and r["gpu"] is None, r
        assert r["device"] == ("/CPU:0" if framework == "keras-tensorflow" else "cpu")
        # TensorFlow is shown no GPU, so it places nothing there; torch pins nothing; Keras on torch uses the CPU.
        assert r["calls"] == ([["visible", [], "GPU"]] if framework == "keras-tensorflow" else [])
        assert r.get("keras_device", "cpu") == "cpu", r


@pytest.mark.parametrize("framework", REFUSALS)
def test_gpus_with_a_horovod_built_without_nccl_stop_every_rank_naming_the_flavour(launch, framework):
    # This machine's Horovod is the CPU build: it would allreduce CUDA tensors through host memory, with no word.
    results = launch(2, "gpu_pinning.py", "--framework", framework, "--gpus", "2", "--nccl-check", expect_ok=False)
    name = "TensorFlow" if framework == "keras-tensorflow" else "torch"
    for r in results:
        error = r["error"]
        assert error.startswith(f"{name} sees GPU(s) but this Horovod was built without NCCL, so every allreduce "
                                "would copy the gradients through host memory: use "), error
        assert "scripts/install.sh --gpu" in error and "HVDKIT_GPU_WITHOUT_NCCL=1" in error and "\n" not in error
        # Each framework is sent to its own GPU flavour.
        assert ("scripts/install.sh --gpu-tf" in error and "FLAVOUR=tensorflow" in error) == (name == "TensorFlow")
        assert r["calls"] == []


@pytest.mark.parametrize("framework", REFUSALS)
def test_gpus_that_cuda_cannot_use_stop_every_rank(launch, framework):
    # /dev/nvidia0 is there, the driver (520) is older than the framework's CUDA needs, CUDA reports no GPU.
    results = launch(2, "gpu_pinning.py", "--framework", framework, "--driver", "520.61.05", expect_ok=False)
    name, minimum, cuda = ("TensorFlow", 525, 12) if framework == "keras-tensorflow" else ("torch", 580, 13)
    assert len(results) == 2
    for r in results:
        error = r["error"]
        assert error.startswith("NVIDIA GPU(s) found (") and "/dev/nvidia0)" in error, error
        assert f"but {name} cannot use CUDA: driver 520.61.05 is older than {minimum}, the minimum for CUDA {cuda}" \
            in error
        assert f"upgrade the NVIDIA driver to {minimum} or newer" in error
        assert "or set HVDKIT_DEVICE=cpu to train on the CPU deliberately" in error and "\n" not in error
        assert r["calls"] == []


@pytest.mark.parametrize("gpus, lines", [(2, 1), (0, 0)], ids=["gpu", "cpu"])
def test_a_gpu_job_on_a_64_mib_dev_shm_warns_once_per_host_and_a_cpu_job_never(tmp_path, gpus, lines):
    """A plain `docker run` gives /dev/shm 64 MiB, too little for NCCL's shared-memory transport and DataLoader
    workers: hk.init() on a pinned GPU says so once per host (local rank 0), naming --ipc=host; on the CPU nothing."""
    cmd = horovodrun_cmd(2, [str(WORKERS / "gpu_pinning.py"), "--out", str(tmp_path), "--framework", "torch",
                             "--gpus", str(gpus), "--shm-mib", "64"], "gloo")
    proc = run_job(cmd, 240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    results = read_rank_results(tmp_path, 2, proc.stdout)
    assert [r["gpu"] for r in results] == ([0, 1] if gpus else [None, None]), results
    said = [line for line in proc.stdout.splitlines() if "hvdkit:" in line]
    assert len(said) == lines, proc.stdout[-4000:]
    if lines:
        assert "/dev/shm is 64 MiB" in said[0] and "--ipc=host or --shm-size=1g" in said[0], said
