"""Each GPU `docker run` the docs give (tests/docker_runs.py), run as written on the built image.

Run less only what this machine cannot give, each change listed (engine.timings["docker_run_changes"] and
the test's output): --gpus (no GPU here) and --ulimit memlock=-1 (root here lacks CAP_SYS_RESOURCE, so a
container asking for it does not start); a line that names no network gets the host's, as the tier's engine
makes no default bridge. Then, with the same flags: /dev/shm holds what NCCL needs (Docker's default is
64 MiB), and a 2-rank job whose DataLoader workers pass 48 MiB batches through /dev/shm trains in one
container, where the same job under Docker's default /dev/shm dies.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hvdkit.common.shared_memory import NCCL_SHM_BYTES
from tests.container.conftest import IMAGE, TF_IMAGE
from tests.docker_runs import NO_BRIDGE, NO_GPU, NO_MEMLOCK, DockerRun, documented_runs

# Whichever test runs first builds the image in its setup (about 25 min), so every test gets the build's limit.
pytestmark = [pytest.mark.container, pytest.mark.timeout(3300)]


def distinct_gpu_runs() -> tuple[list[DockerRun], dict[tuple[str, ...], str]]:
    """Each whole GPU command once (docs/DOCKER.md and Dockerfile.gpu's header give the same lines), and the
    sources that give it ("docs/DOCKER.md:7+Dockerfile.gpu:9")."""
    runs, sources = [], {}
    for run in documented_runs():
        if run.gpu and run.whole and run.of_the_kit:
            if run.argv not in sources:
                runs.append(run)
            sources[run.argv] = "+".join(filter(None, [sources.get(run.argv), run.source]))
    return runs, sources


GPU_RUNS, SOURCES = distinct_gpu_runs()
ALLOWED = (NO_GPU, NO_MEMLOCK, NO_BRIDGE)
# What only a GPU can run (docs/GPU.md's acceptance run): here it must start and then refuse, saying why.
ONLY_ON_A_GPU = ("scripts/gpu_acceptance.py",)

# 48 samples of 4 MiB, batches of 12 (48 MiB): each DataLoader worker hands its batch over in /dev/shm, so 2 ranks
# x 2 workers need about 200 MiB of it at once. hvdkit starts workers by default on a GPU only; here they are asked.
LOADER = """\
import torch
from torch.utils.data import TensorDataset

import hvdkit.torch as hk

if __name__ == "__main__":
    ctx = hk.init(seed=0)
    rows = torch.arange(48, dtype=torch.float32)
    data = TensorDataset(rows[:, None].repeat(1, 1 << 20), torch.arange(48))
    loader = hk.distributed_loader(data, 12, num_workers=2, seed=0)
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        seen = 0
        for x, y in loader:
            assert torch.equal(x[:, 0], y.float()) and torch.equal(x[:, -1], y.float())
            seen += len(y)
    print(f"loader ok rank {ctx.rank} of {ctx.size}: {seen} samples, workers {loader.num_workers}", flush=True)
"""


def image_fixture(request, run) -> str:
    """The built image a documented line names (the TensorFlow flavour only when a line runs it)."""
    if run.image == TF_IMAGE:
        return request.getfixturevalue("tf_image")
    assert run.image == IMAGE, f"{run}: an image the tier does not build"
    return request.getfixturevalue("image")


def here(engine, run, cwd: Path) -> list[str]:
    """The command as this machine can start it, from ``cwd`` (a shell there expands ``$PWD`` to it)."""
    argv, changes = run.argv_here()
    assert changes and all(change.endswith(ALLOWED) for change in changes), (str(run), changes)
    argv = [word.replace("${PWD}", str(cwd)).replace("$PWD", str(cwd)) for word in argv]
    print(f"{run}\n  runs here as: docker {' '.join(argv)}\n  " + "\n  ".join(changes))
    engine.timings.setdefault("docker_run_changes", {})[SOURCES[run.argv]] = changes
    return argv


def with_command(argv: list[str], image: str, *command: str) -> list[str]:
    """The same `docker run` flags and image, another command (through the image's entrypoint)."""
    return [*argv[:argv.index(image) + 1], *command]


def without_shared_memory(argv: list[str]) -> list[str]:
    """``argv`` (from :meth:`DockerRun.argv_here`: options and values as separate words) without --ipc or
    --shm-size: the container gets Docker's default 64 MiB /dev/shm."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in ("--ipc", "--shm-size"):
            skip = True
        else:
            out.append(word)
    return out


@pytest.mark.parametrize("run", GPU_RUNS, ids=lambda r: SOURCES[r.argv])
def test_each_documented_gpu_docker_run_starts_as_written_less_what_this_machine_lacks(engine, request, run,
                                                                                         tmp_path):
    image_fixture(request, run)
    proc = engine.docker(*here(engine, run, tmp_path), timeout=1800, check=False, cwd=tmp_path)
    out = (proc.stdout or "") + (proc.stderr or "")
    if any(word.endswith(ONLY_ON_A_GPU) for word in run.command):
        # It started (image, entrypoint, script path, mounts): here, without a GPU, it stops in one line.
        assert proc.returncode != 0 and "Traceback" not in out and "GPU" in out, f"{run}:\n{out[-4000:]}"
        return
    assert proc.returncode == 0, f"{run} exited {proc.returncode}:\n{out[-4000:]}"
    if not run.command:                                    # the image's CMD: hvdkit env
        assert "NCCL" in out, out[-3000:]
    elif run.command[:2] == ["hvdkit", "launch"]:          # training in one container, on the CPU here
        np = int(run.command[run.command.index("-np") + 1])
        assert re.search(rf"\b{np} processes on 1 host\(s\)", out), out[-3000:]
        assert "final test accuracy" in out, out[-3000:]
    assert not re.findall(r"^.*hvdkit: .*$", out, re.M), "a correct run warned (no GPU here: no /dev/shm warning)"


@pytest.mark.parametrize("run", GPU_RUNS, ids=lambda r: SOURCES[r.argv])
def test_the_documented_flags_give_dev_shm_at_least_what_nccl_needs(engine, request, run, tmp_path):
    image = image_fixture(request, run)
    argv = with_command(here(engine, run, tmp_path), image, "python", "-c",
                        "from hvdkit.common.shared_memory import shm_bytes; print(shm_bytes())")
    size = int(engine.docker(*argv, timeout=300, cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert size >= NCCL_SHM_BYTES, f"{run}: /dev/shm is {size >> 20} MiB in its container"


def test_a_two_rank_job_with_dataloader_workers_trains_in_one_container_with_the_documented_flags(engine, image,
                                                                                                   tmp_path):
    training = [run for run in GPU_RUNS if run.command[:2] == ["hvdkit", "launch"] and run.image == IMAGE]
    assert training, "no documented one-container training line"
    script = f"cat > /tmp/loader.py <<'PY'\n{LOADER}PY\nhvdkit launch -np 2 -- python /tmp/loader.py"
    argv = with_command(here(engine, training[0], tmp_path), image, "sh", "-c", script)
    proc = engine.docker(*argv, timeout=600, check=False)
    out = (proc.stdout or "") + (proc.stderr or "")
    assert proc.returncode == 0, out[-4000:]
    assert sorted(re.findall(r"loader ok rank (\d) of 2: 24 samples, workers 2", out)) == ["0", "1"], out[-3000:]
    # The control: the same job in Docker's default 64 MiB /dev/shm (--ipc=host taken out) dies, as a copied
    # `docker run --gpus all hvdkit:gpu ...` did before the docs passed the flag.
    plain = without_shared_memory(argv)
    assert len(plain) == len(argv) - 2, argv
    proc = engine.docker(*plain, timeout=600, check=False)
    out = (proc.stdout or "") + (proc.stderr or "")
    assert proc.returncode != 0 and re.search(r"Bus error|shared memory|No space left on device", out), out[-3000:]
