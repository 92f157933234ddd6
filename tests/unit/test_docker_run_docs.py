"""Every GPU `docker run` the docs give starts a container NCCL can work in: shared memory and pinned memory.

Docker gives a container 64 MiB of /dev/shm unless it is started with --ipc=host or
--shm-size: NCCL's transport between a host's GPUs fails to extend its segments, and
DataLoader workers die with a bus error. NCCL pins host memory (and InfiniBand needs
it unlimited): --ulimit memlock=-1. NCCL's user guide (Troubleshooting, Docker) runs
its containers with both. Compose and Kubernetes set them; a copied `docker run` must
too. The image tier runs these lines (tests/container/test_docker_run_docs.py).
"""

import re

import pytest

from tests.conftest import ROOT
from tests.docker_runs import DockerRun, documented_runs, header_runs, page_runs

pytestmark = pytest.mark.unit


def lacks(run: DockerRun) -> list[str]:
    return [what for ok, what in ((run.shared_memory(), "--ipc=host or --shm-size"),
                                  (run.unlimited_memlock(), "--ulimit memlock=-1")) if not ok]


def test_every_documented_gpu_docker_run_has_ipc_host_or_shm_size_and_unlimited_memlock():
    gpu = [run for run in documented_runs() if run.gpu and run.of_the_kit]
    assert len(gpu) >= 3, f"the docs' GPU `docker run` lines were not found: {gpu}"
    missing = [f"{run}  (lacks {' and '.join(lacks(run))})" for run in gpu if not run.nccl_ready()]
    assert not missing, "GPU containers without NCCL's shared or pinned memory:\n" + "\n".join(missing)


def test_the_docs_show_how_to_train_on_all_gpus_in_one_container():
    """A `docker run` of the image that trains (hvdkit launch ... python examples/...), runnable as written: the
    image's working directory holds examples/ and its entrypoint runs any command."""
    training = [run for run in documented_runs() if run.gpu and run.whole and run.command[:2] == ["hvdkit", "launch"]]
    assert training, "no documented `docker run ... hvdkit launch` (training in one GPU container)"
    dockerfile = (ROOT / "Dockerfile.gpu").read_text()
    runtime = dockerfile[dockerfile.index("AS runtime"):]
    assert "WORKDIR /opt/hvdkit/src" in runtime and "COPY --from=builder /opt/hvdkit /opt/hvdkit" in runtime
    assert re.search(r"^COPY examples \./examples$", dockerfile, re.M)
    assert 'exec "$@"' in (ROOT / "docker" / "entrypoint.sh").read_text()
    for run in training:
        script = next(word for word in run.command if word.endswith(".py"))
        assert (ROOT / script).is_file(), f"{run}: {script} is not in the repository (nor in the image)"
        assert run.image.startswith("hvdkit:gpu"), run


def test_runs_are_read_from_blocks_spans_and_headers_as_a_user_copies_them():
    page = ("Prose that names `docker run` is not a command.\n\n"
            "```bash\n"
            "docker build -t hvdkit:gpu .\n"
            "NCCL_DEBUG=INFO docker run --gpus all --ipc=host \\\n"
            "  --ulimit memlock=-1 --rm hvdkit:gpu hvdkit launch -np 8 -- python examples/pytorch_mnist.py  # all 8\n"
            "echo docker run is not run here\n"
            "```\n\n"
            "For InfiniBand: `docker run --gpus all --device /dev/infiniband\n--shm-size=8g ...`.\n")
    runs = page_runs("x.md", page)
    assert [(r.source, r.whole) for r in runs] == [("x.md:5", True), ("x.md:10", False)]
    train, fragment = runs
    assert train.argv[:2] == ("docker", "run") and train.image == "hvdkit:gpu" and "#" not in train.argv
    assert train.command == ["hvdkit", "launch", "-np", "8", "--", "python", "examples/pytorch_mnist.py"]
    assert train.gpu and train.nccl_ready()
    assert fragment.gpu and fragment.shared_memory() and not fragment.unlimited_memlock()
    header = header_runs("Dockerfile", "# Usage:\n#   docker run --gpus all --rm hvdkit:gpu   # hvdkit env\nFROM x\n"
                                       "# a plain docker run gives 64 MiB\n")
    assert [str(r) for r in header] == ["Dockerfile:2: docker run --gpus all --rm hvdkit:gpu"]
    assert header[0].gpu and not header[0].shared_memory() and not header[0].unlimited_memlock()
    cpu = DockerRun("y.md:1", ("docker", "run", "--rm", "hvdkit:gpu", "hvdkit", "env"), True)
    assert not cpu.gpu, "no --gpus: a CPU container, which needs neither"
    toolkit = DockerRun("y.md:2", ("docker", "run", "--rm", "--gpus", "all", "ubuntu", "nvidia-smi"), True)
    assert toolkit.gpu and not toolkit.of_the_kit, "another image, checking the container toolkit: not a job"
    assert train.of_the_kit and fragment.of_the_kit


def test_the_image_tier_removes_only_what_this_machine_cannot_give():
    run = DockerRun("z.md:1", ("docker", "run", "--gpus", "all", "--ipc=host", "--ulimit", "memlock=-1",
                               "--ulimit", "stack=67108864", "--rm", "hvdkit:gpu", "hvdkit", "env"), True)
    argv, changes = run.argv_here()
    assert argv == ["run", "--ipc", "host", "--ulimit", "stack=67108864", "--rm", "--network", "host",
                    "hvdkit:gpu", "hvdkit", "env"]
    assert [c.split(":")[0] for c in changes] == ["removed --gpus all", "removed --ulimit memlock=-1",
                                                  "added --network host"]
    argv, changes = DockerRun("z.md:2", ("docker", "run", "--gpus=all", "--network", "host", "hvdkit:gpu"),
                              True).argv_here()
    assert argv == ["run", "--network", "host", "hvdkit:gpu"] and [c.split(":")[0] for c in changes] == [
        "removed --gpus all"]
