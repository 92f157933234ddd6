"""The README stays a five-minute read, and every link in it and in docs/ leads to a file that exists."""

import re

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_is_at_most_160_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 160


@pytest.mark.parametrize("page", ["README.md", *sorted(p.relative_to(ROOT).as_posix()
                                                       for p in (ROOT / "docs").glob("*.md"))])
def test_relative_links_resolve(page):
    path = ROOT / page
    missing = [target for target in LINK.findall(path.read_text())
               if "://" not in target and not (path.parent / target).exists()]
    assert not missing, f"{page} links to missing files: {missing}"


FENCE = re.compile(r"(?m)^[ \t]*```(\S*)[ \t]*$")
RUN = {"python", "diff", "bash"}            # the languages tests/docblocks runs (or checks, after a not-run marker)


@pytest.mark.parametrize("page", ["README.md", *sorted(p.relative_to(ROOT).as_posix()
                                                       for p in (ROOT / "docs").glob("*.md"))])
def test_every_code_block_is_in_a_language_the_docs_tests_run(page):
    """A ```sh or ```py block would escape Sybil unseen; a block with no language is output, not code."""
    fences = FENCE.findall((ROOT / page).read_text())
    opening = fences[::2]                   # fences alternate: opening (with its language), closing
    assert all(not f for f in fences[1::2]), f"{page}: a closing fence with a language"
    assert set(opening) <= RUN | {""}, f"{page}: blocks in {sorted(set(opening) - RUN - {''})}"


@pytest.mark.parametrize("readme_says, raw_file, lines", [
    # the fusion default: the 161 gradients at 1 MiB and at Horovod's 128 MiB
    ("45.2 ms, MPI one by one 45.3", "fusion/allreduce-1M.txt", [r"hvdkit\s+45\.2 ms", r"mpi4py-avg\s+45\.3 ms"]),
    ("at 128 MiB 106.2, 55.8", "fusion/allreduce-128M.txt", [r"hvdkit\s+106\.2 ms", r"mpi4py-avg\s+55\.8 ms"]),
    # the cycle default: at the shipped defaults, and at Horovod's 1 ms
    ("16 / 64 MiB at 105% / 99%", "cycle/allreduce-default.txt", [r"16 MiB .* 105%", r"64 MiB .* 99%"]),
    ("at Horovod's 1 ms, 75% / 96%", "cycle/allreduce-1ms-16M64M.txt", [r"16 MiB .* 75%", r"64 MiB .* 96%"]),
])
def test_readme_performance_numbers_are_in_the_raw_files(readme_says, raw_file, lines):
    """The one-host numbers README's Performance section quotes, against docs/bench/ as hvdkit bench wrote it
    (the across-hosts ones: tests/unit/test_scaling_analysis.py)."""
    assert readme_says in (ROOT / "README.md").read_text()
    raw = (ROOT / "docs" / "bench" / raw_file).read_text()
    for line in lines:
        assert re.search(line, raw), (raw_file, line)


@pytest.mark.parametrize("page", ["README.md", *sorted(p.relative_to(ROOT).as_posix()
                                                       for p in (ROOT / "docs").glob("*.md"))])
def test_no_page_passes_mpiruns_x_option_to_horovodrun(page):
    # horovodrun has no -x (horovod/runner/launch.py); it forwards the environment itself. DOCKER.md said otherwise.
    text = " ".join((ROOT / page).read_text().split())
    assert not re.search(r"`-x` to horovodrun|horovodrun (?:[^`\n]* )?-x [A-Z_]+=", text), page


def test_clusters_md_describes_train_gpu_sbatch_as_the_script_allocates():
    """The script asks GPUs per node (every task sees its node's GPUs, hvdkit pins the local rank's, NVLink stays);
    CLUSTERS.md called it one GPU a task and quoted the --gpus-per-task run's results, which its test contradicts
    (tests/multihost/test_slurm.py: CUDA_VISIBLE_DEVICES=0,1,2,3 in every task, each pinned its local rank)."""
    script = (ROOT / "examples" / "slurm" / "train_gpu.sbatch").read_text()
    asks = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", script, re.M))
    assert "gpus-per-task" not in asks
    text = " ".join((ROOT / "docs" / "CLUSTERS.md").read_text().split())
    said = (f"`examples/slurm/train_gpu.sbatch` ({asks['nodes']} nodes x {asks['ntasks-per-node']} tasks, every task "
            f"seeing its node's {asks['gpus-per-node']} GPUs and pinning its local rank's, {asks['cpus-per-task']} "
            "CPUs a task")
    assert said in text, said
    tested = "train_gpu.sbatch: accepted by sbatch, 8 tasks, every task seeing `CUDA_VISIBLE_DEVICES=0,1,2,3`"
    assert tested in text and "every rank pinned `cuda:0`" not in text and "gres:gpu:1" not in text


def test_docker_md_and_the_dockerfile_say_horovod_carries_its_own_cuda_runtime():
    """Horovod 0.28.1's CMakeLists.txt defaults CMAKE_CUDA_RUNTIME_LIBRARY to Static (cudart_static): a process holds
    that copy beside the framework's shared libcudart. "One CUDA runtime in the process" was not true."""
    for name in ("docs/DOCKER.md", "Dockerfile.gpu"):
        text = " ".join((ROOT / name).read_text().replace("#", " ").split())
        assert not re.search(r"one (NCCL and one )?CUDA( runtime)?( and one NCCL)? in the process", text), name
        assert "cudart_static" in text, f"{name} does not say Horovod links the CUDA runtime statically"
