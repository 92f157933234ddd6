"""The PyTorch example under a real Slurm cluster on two test hosts (2 nodes x 2 tasks), both ways a user
launches it there: `srun --mpi=pmix` directly (no ssh, no horovodrun) and `hvdkit launch` inside the
allocation (hosts read from SLURM_JOB_NODELIST / SLURM_TASKS_PER_NODE). Each must give the world size 4,
both hosts, and the same test accuracy as 4 MPI processes on one host.

The same cluster has GPU GRES (4 stand-in GPUs a node, see SlurmHosts): the shipped batch scripts in
examples/slurm/ are submitted as they are, and each rank's GPU, as Slurm set it and as hvdkit pinned
it, is checked with torch.cuda faked from CUDA_VISIBLE_DEVICES (workers/slurm_gpu_task.py)."""

import json
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.conftest import BIN, ROOT, hvdkit_cmd, job_env, run_job
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
    # CPUs and GPUs as the GPU batch script asks (4 tasks x 8 CPUs, a GPU each, a node): declared, not real
    # (SlurmdParameters=config_overrides); the CPU tests ask for 2 tasks a node and no GPU.
    with SlurmHosts(["hosta", "hostb"], cpus_per_host=32, gpus_per_host=4) as cluster:
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
    launch = shlex.join(hvdkit_cmd("launch", "-p", str(PORT), "--network-interface", "eth0", "--mpi"))
    text = run_batch(slurm, f"{launch} -- {EXAMPLE}")
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


GPU_TASK = ROOT / "tests" / "multihost" / "workers" / "slurm_gpu_task.py"


def stand_in_venv(tmp_path):
    """A venv (HVDKIT_VENV, as the scripts document) whose python runs the GPU probe in place of
    examples/pytorch_mnist.py, with the example's arguments; anything else runs the real python."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(
        f'#!/bin/sh\ncase "$1" in\n  *examples/pytorch_mnist.py) exec {sys.executable} {GPU_TASK} "$@";;\nesac\n'
        f'exec {sys.executable} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    (bin_dir / "hvdkit").symlink_to(hvdkit_cmd()[0])
    return bin_dir.parent


def run_gpu_script(slurm, tmp_path, script: str, options: list[str], ranks: int, **env) -> tuple[list[dict], str]:
    """Submit examples/slurm/<script> unchanged from the repository root; each rank's record and the job's output."""
    out = tmp_path / "ranks"
    out.mkdir()
    env_ = {**job_env(), "SLURM_CONF": str(slurm.conf), "HVDKIT_VENV": str(stand_in_venv(tmp_path)),
                "SLURM_GPU_TASK_OUT": str(out), **env}
    for inherited in ("NCCL_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE", "IFACE", "SRUN_CPUS_PER_TASK"):
        env_.pop(inherited, None)        # what the script sets must come from the script
    job, output = slurm.sbatch_file(ROOT / "examples" / "slurm" / script, ["-p", "test", *options], env_, cwd=ROOT)
    state, text = slurm.wait(job, output, timeout=240)
    assert state == "COMPLETED", f"job {job} ended {state}:\n{text[-3000:]}\n{slurm.logs()}"
    records = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in records] == list(range(ranks)), text[-3000:]
    assert all(r["size"] == ranks for r in records)
    return records, text


def by_host(records):
    hosts = {}
    for r in records:
        hosts.setdefault(r["host"], []).append(r)
    return hosts


def test_sbatch_takes_the_gpu_script_and_refuses_a_node_range(slurm):
    """Why train_gpu.sbatch keeps --nodes one number: with a range sbatch derives no task count."""
    script = ROOT / "examples" / "slurm" / "train_gpu.sbatch"
    ok = subprocess.run(["sbatch", "--test-only", "-p", "test", str(script)], capture_output=True, text=True,
                        env=slurm.env, timeout=30)
    assert ok.returncode == 0 and "using 64 processors on nodes hosta,hostb" in ok.stderr, ok.stderr
    ranged = subprocess.run(["sbatch", "--test-only", "-p", "test", "-N", "1-2", str(script)], capture_output=True,
                            text=True, env=slurm.env, timeout=30)
    assert ranged.returncode != 0
    assert "--gpus-per-task used without either --gpus or -n/--ntasks is not allowed" in ranged.stderr


def test_gpu_batch_script_gives_each_task_its_own_gpu(slurm, tmp_path):
    """train_gpu.sbatch as shipped: 2 nodes x 4 tasks, --gpus-per-task=1, --cpus-per-task=8, srun --mpi=pmix."""
    data, ckpt = tmp_path / "mnist", tmp_path / "ckpt"
    records, _ = run_gpu_script(slurm, tmp_path, "train_gpu.sbatch", [], 8,
                                EPOCHS="1", DATA_DIR=str(data), CKPT=str(ckpt))
    hosts = by_host(records)
    assert sorted(hosts) == ["hosta", "hostb"] and all(len(ranks) == 4 for ranks in hosts.values())
    for host, ranks in hosts.items():
        # Slurm bound one GPU to each task (per_task:1): its own index, in both variables.
        assert sorted(r["env"]["CUDA_VISIBLE_DEVICES"] for r in ranks) == ["0", "1", "2", "3"], (host, ranks)
        assert all(r["env"]["SLURM_STEP_GPUS"] == r["env"]["CUDA_VISIBLE_DEVICES"] for r in ranks), ranks
    for r in records:
        # One visible GPU, its own: hvdkit pins it, device 0, whatever the local rank.
        assert "error" not in r and r["gpu"] == 0 and r["device"] == "cuda:0" and r["calls"] == [["set_device", 0]], r
        # SRUN_CPUS_PER_TASK: the step asks 8 CPUs per task, as the job does (else TresPerTask=gres:gpu:1 only).
        assert r["step"]["TresPerTask"] == "cpu:8,gres:gpu:1", r["step"]
        # No interface named: NCCL chooses.
        assert r["env"]["NCCL_SOCKET_IFNAME"] is None and r["env"]["HOROVOD_GLOO_IFACE"] is None, r["env"]
        assert r["argv"] == ["examples/pytorch_mnist.py", "--dataset", "mnist", "--data-dir", str(data),
                             "--epochs", "1", "--checkpoint-dir", str(ckpt)]


def test_launch_in_allocation_with_gpus_per_node_pins_local_ranks(slurm, tmp_path):
    """launch_in_salloc.sh as shipped, GPUs per node: every rank sees its node's 2 GPUs and pins its local rank."""
    records, text = run_gpu_script(slurm, tmp_path, "launch_in_salloc.sh",
                                   ["-N", "2", "--ntasks-per-node=2", "--gpus-per-node=2"], 4, EPOCHS="1")
    assert "-np 4 -H hosta:2,hostb:2" in text, text[-3000:]
    hosts = by_host(records)
    assert sorted(hosts) == ["hosta", "hostb"]
    for r in records:
        assert r["env"]["CUDA_VISIBLE_DEVICES"] == "0,1", r["env"]
        assert "error" not in r and r["gpu"] == r["local_rank"] and r["calls"] == [["set_device", r["local_rank"]]], r
        assert r["argv"] == ["examples/pytorch_mnist.py", "--epochs", "1"]
    assert all(sorted(r["gpu"] for r in ranks) == [0, 1] for ranks in hosts.values())
