"""hvdkit.ops.cuda_arches against nvcc's own output: the GPU generations a library was compiled for.

nvcc (CUDA 13, on this machine kind's PATH) compiles a one-kernel library for
known -gencode lists; no GPU is needed to compile. The reader must return
exactly those lists, and nothing for a library without CUDA code.
"""

import glob
import shutil
import subprocess

import pytest

from hvdkit.ops.cuda_arches import CudaArches, fatbin_arches
from tests.conftest import BIN

pytestmark = pytest.mark.cli


def compile_kernel(tmp_path, *gencode: str) -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.fail("nvcc not found: the CUDA 13 toolkit is on this machine kind's PATH (docs/TESTING.md)")
    (tmp_path / "k.cu").write_text("__global__ void twice(float* x) { x[threadIdx.x] *= 2; }\n")
    out = tmp_path / "k.so"
    flags = [f for g in gencode for f in ("-gencode", g)]
    subprocess.run([nvcc, "-Xcompiler", "-fPIC", "-shared", str(tmp_path / "k.cu"), *flags, "-o", str(out)],
                   check=True, capture_output=True, timeout=300)
    return str(out)


@pytest.mark.timeout(600)
def test_sass_and_ptx_are_read_from_the_fatbin(tmp_path):
    lib = compile_kernel(tmp_path, "arch=compute_75,code=sm_75", "arch=compute_90,code=sm_90",
                         "arch=compute_120,code=[sm_120,compute_120]")
    assert fatbin_arches(lib) == CudaArches(sass=(75, 90, 120), ptx=(120,))


def test_a_cpu_library_has_no_cuda_arches():
    libs = glob.glob(str(BIN.parent / "lib" / "python3*" / "site-packages" / "horovod" / "torch" / "mpi_lib_v2*.so"))
    assert libs, "the CPU venv's Horovod torch library is missing: make install"
    assert fatbin_arches(libs[0]) is None
