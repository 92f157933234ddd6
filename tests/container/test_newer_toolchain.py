"""Horovod's patched sources under a newer toolchain than Debian 12's: GCC 14 and CMake 4.

NVIDIA's CUDA 13 base is Ubuntu 24.04 with GCC 13, and a venv or base image may
carry CMake 4; CI's stand-in is Debian 12 (GCC 12, the lock's CMake 3). On an H100
machine (GCC 13.3, CMake 4.4.3) the patched 0.28.1 did not build: headers that
relied on other standard headers for <string> and <stdexcept>, and the bundled
gloo's cmake_minimum_required(2.8.12) (patch item 16). Here every core source
file that this machine's GCC compiles must also compile with Debian 13's GCC 14
(in a debootstrap chroot), and the bundled gloo must configure with CMake 4.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.container.conftest import CACHE
from tests.container.engine import _host_debian_mirror

pytestmark = [pytest.mark.container, pytest.mark.timeout(1200)]

# The core's translation units, Gloo's included; those that need MPI, CUDA, NCCL or a vendor library are
# the NEEDS_OTHER_HEADERS below (this machine's GCC cannot compile them alone either).
SOURCES = ["horovod/common/*.cc", "horovod/common/ops/*.cc", "horovod/common/utils/*.cc", "horovod/common/optim/*.cc",
           "horovod/common/gloo/*.cc"]
NEEDS_OTHER_HEADERS = {f"horovod/common/ops/{name}.cc" for name in (
    "adasum_gpu_operations", "adasum_mpi_operations", "ccl_operations", "cuda_operations", "ddl_operations",
    "gpu_context_impl", "gpu_operations", "hip_operations", "mpi_gpu_operations", "mpi_operations",
    "nccl_operations")} | {"horovod/common/gloo/gloo_context.cc", "horovod/common/gloo/http_store.cc"}
# The ones GCC 13 and 14 stopped at before the patch's item 16, and those holding item 17's bfloat16.
MUST_COMPILE = {"horovod/common/group_table.cc", "horovod/common/common.cc", "horovod/common/message.cc",
                "horovod/common/operations.cc", "horovod/common/nvtx_op_range.cc", "horovod/common/half.cc",
                "horovod/common/ops/collective_operations.cc", "horovod/common/ops/gloo_operations.cc",
                "horovod/common/gloo/gloo_controller.cc"}
# What gloo's CMake would generate: the TCP transport only.
GLOO_CONFIG = "#pragma once\n" + "".join(f"#define GLOO_{k} {v}\n" for k, v in (
    ("VERSION_MAJOR", 0), ("VERSION_MINOR", 5), ("VERSION_PATCH", 0), ("USE_CUDA", 0), ("USE_NCCL", 0),
    ("USE_ROCM", 0), ("USE_RCCL", 0), ("USE_REDIS", 0), ("USE_IBVERBS", 0), ("USE_MPI", 0), ("USE_AVX", 0),
    ("USE_LIBUV", 0), ("HAVE_TRANSPORT_TCP", 1), ("HAVE_TRANSPORT_TCP_TLS", 0), ("HAVE_TRANSPORT_IBVERBS", 0),
    ("HAVE_TRANSPORT_UV", 0)))


def pin(key: str) -> str:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "installer.py"), "pins", key], check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def patched_source(tmp_path_factory) -> Path:
    """Horovod's pinned sdist (the install's cached copy), unpacked and patched by install.sh --patch-only."""
    version = pin("HOROVOD_VERSION")
    sdist = CACHE / "src" / f"horovod-{version}.tar.gz"
    assert sdist.is_file(), f"{sdist} is missing: run make install first (it downloads and checks the sdist)"
    where = tmp_path_factory.mktemp("horovod")
    with tarfile.open(sdist) as tar:
        tar.extractall(where, filter="data")
    src = where / f"horovod-{version}"
    subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "--patch-only", str(src)], check=True,
                   capture_output=True, text=True, timeout=120)
    (src / "gloo-config" / "gloo").mkdir(parents=True)
    (src / "gloo-config" / "gloo" / "config.h").write_text(GLOO_CONFIG)
    return src


def syntax_check(src: Path, files: list[str], root: Path | None = None) -> dict[str, str]:
    """{file: first error line} for the files g++ -fsyntax-only rejects; inside ``root`` by chroot if given."""
    includes = ["third_party/flatbuffers/include", "third_party/lbfgs/include", "third_party/eigen",
                "third_party/gloo", "gloo-config",
                *sorted(str(p.relative_to(src)) for p in src.glob("third_party/boost/*/include"))]
    # collective_operations.h logs without including logging.h (the build's .cc files include it first).
    flags = "-std=c++17 -fsyntax-only -DHAVE_GLOO=1 -include horovod/common/logging.h " + \
        " ".join("-I" + i for i in includes)
    script = "\n".join(
        f'g++ {flags} {f} >/tmp/err 2>&1 '
        f'|| echo "FAIL {f} $(grep -m1 error: /tmp/err)"' for f in files)
    where = "/src" if root else str(src)
    argv = ["bash", "-c", f"cd {where} && {script}"]
    if root:
        argv = ["chroot", str(root), *argv]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=900).stdout
    return {line.split()[1]: line for line in out.splitlines() if line.startswith("FAIL ")}


def test_the_patched_core_compiles_with_gcc_14(patched_source, tmp_path):
    files = sorted(str(p.relative_to(patched_source)) for pattern in SOURCES for p in patched_source.glob(pattern))
    here = syntax_check(patched_source, files)
    assert set(here) == NEEDS_OTHER_HEADERS, "this machine's GCC: " + "\n".join(
        f"{f} {here.get(f, 'compiles')}" for f in sorted(set(here) ^ NEEDS_OTHER_HEADERS))
    compiled_here = [f for f in files if f not in here]
    assert MUST_COMPILE <= set(compiled_here) and len(compiled_here) >= 20, compiled_here

    rootfs = tmp_path / "rootfs"
    suite = pin("NEWER_TOOLCHAIN_DEBIAN_VERSION")
    proc = subprocess.run(["debootstrap", "--variant=minbase", "--include=g++", suite, str(rootfs),
                           _host_debian_mirror()], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"debootstrap {suite} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    try:
        gcc = subprocess.run(["chroot", str(rootfs), "g++", "-dumpversion"], capture_output=True, text=True).stdout
        assert int(gcc.split(".")[0]) >= 14, f"Debian {suite}'s g++ is {gcc}"
        shutil.copytree(patched_source, rootfs / "src", symlinks=True)
        there = syntax_check(patched_source, compiled_here, root=rootfs)
        assert there == {}, f"GCC {gcc.strip()} rejects what GCC here compiles: " + "\n".join(there.values())
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)


def test_the_bundled_gloo_configures_with_cmake_4(patched_source, tmp_path):
    version = pin("NEWER_TOOLCHAIN_CMAKE_VERSION")
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    f"cmake=={version}", "-d", str(tmp_path)], check=True, timeout=600)
    wheel = next(tmp_path.glob("cmake-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp_path / "cmake")
    cmake = tmp_path / "cmake" / "cmake" / "data" / "bin" / "cmake"
    cmake.chmod(0o755)
    proc = subprocess.run([str(cmake), "-S", str(patched_source / "third_party" / "gloo"), "-B",
                           str(tmp_path / "build")], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "CMAKE_POLICY_VERSION_MINIMUM"})
    assert proc.returncode == 0, f"CMake {version} cannot configure gloo:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    assert f"cmake version {version}" in subprocess.run([str(cmake), "--version"], capture_output=True,
                                                          text=True).stdout
