"""The GPU flavour, proven on a machine without a GPU: Horovod built with NCCL against torch's CUDA and NCCL.

`make test-gpu-build` first runs `scripts/install.sh --gpu` into .venv-gpu (CI:
with an empty wheel cache, so from source), then these tests ask that build
what it is. They run the GPU venv's own interpreter; without it they fail.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_install_script import pins
from tests.conftest import ROOT, run_job

pytestmark = pytest.mark.gpu_build
GPU_VENV = Path(os.environ.get("HVDKIT_GPU_VENV", ROOT / ".venv-gpu"))


def gpu_bin(name: str) -> str:
    path = GPU_VENV / "bin" / name
    if not path.exists():
        pytest.fail(f"{path} not found: run `make test-gpu-build` (scripts/install.sh --gpu into {GPU_VENV})")
    return str(path)


def gpu_python(code: str, timeout: float = 120) -> str:
    proc = subprocess.run([gpu_bin("python"), "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def site_packages() -> Path:
    return Path(gpu_python("import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())


@pytest.fixture(scope="module")
def env_report() -> dict:
    out = subprocess.run([gpu_bin("hvdkit"), "env", "--json"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_horovod_has_nccl_and_cuda_for_torchs_cuda(env_report):
    p = pins()
    hb = env_report["horovod"]
    assert hb is not None, env_report["horovod_error"]
    assert hb["tensor_operations"]["nccl"] and hb["nccl_version"], "Horovod was built without NCCL"
    assert hb["cuda_built"] and hb["frameworks"]["torch"]
    assert hb["controllers"] == {"mpi": True, "gloo": True}
    assert env_report["packages"]["torch"] == p["TORCH_VERSION"]
    assert env_report["torch_cuda"].split(".")[0] == p["TORCH_CUDA_MAJOR"]
    assert hb["torch_cxx_standard"] == "C++20"
    # The NCCL Horovod was compiled with is the one torch's wheel ships.
    wheel_nccl = gpu_python("import importlib.metadata as m; print(m.version('nvidia-nccl-cu%s'))"
                            % p["TORCH_CUDA_MAJOR"]).strip()
    assert wheel_nccl.startswith(hb["nccl_version"]), (wheel_nccl, hb["nccl_version"])


def test_horovods_torch_library_resolves_nccl_to_torchs_wheel():
    libs = sorted((site_packages() / "horovod" / "torch").glob("mpi_lib_v2*.so"))
    assert libs, "no horovod/torch/mpi_lib_v2*.so in the GPU venv"
    ldd = subprocess.run(["ldd", str(libs[0])], capture_output=True, text=True, timeout=60).stdout
    match = re.search(r"libnccl\.so\.2 => (\S+)", ldd)
    assert match, f"mpi_lib_v2 does not link libnccl.so.2 dynamically:\n{ldd}"
    assert Path(match.group(1)).resolve() == (site_packages() / "nvidia" / "nccl" / "lib" / "libnccl.so.2").resolve()


def test_torch_then_horovod_loads_a_single_nccl_and_cuda_runtime():
    out = gpu_python(
        "import json, os, torch, horovod.torch as hvd\n"
        "maps = open('/proc/self/maps').read().split('\\n')\n"
        "print(json.dumps(sorted({os.path.realpath(l.split()[-1]) for l in maps if '/' in l})))")
    loaded = json.loads(out)
    nccl = [p for p in loaded if re.search(r"/libnccl\.so", p)]
    cudart = [p for p in loaded if re.search(r"/libcudart\.so", p)]
    assert len(nccl) == 1 and str(site_packages() / "nvidia" / "nccl") in nccl[0], nccl
    # Horovod links the CUDA runtime dynamically here; it must be the same file torch loads.
    assert len(cudart) == 1 and str(site_packages() / "nvidia") in cudart[0], cudart


def test_cpu_allreduce_on_two_ranks_in_the_nccl_build(tmp_path):
    script = tmp_path / "smoke.py"
    script.write_text(
        "import torch, horovod.torch as hvd\n"
        "hvd.init()\n"
        "t = hvd.allreduce(torch.full((4,), float(hvd.rank() + 1)), op=hvd.Sum)\n"
        "assert hvd.size() == 2 and t.tolist() == [3.0] * 4, (hvd.size(), t)\n"
        "print('smoke ok', hvd.rank(), hvd.size(), hvd.nccl_built())\n")
    proc = run_job([gpu_bin("horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", gpu_bin("python"), str(script)],
                   timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert proc.stdout.count("smoke ok") == 2

