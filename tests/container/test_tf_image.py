"""The TensorFlow flavour of Dockerfile.gpu (FLAVOUR=tensorflow), built on its stand-ins and asked what it is.

TensorFlow's GPU wheels are CUDA 12; its Horovod build takes nvcc from the devel base (Debian 13's
nvidia-cuda-toolkit 12.4 in the stand-in, NVIDIA's 12.9 for users) and NCCL and the CUDA runtime from
TensorFlow's wheels. The stand-in's Python is 3.13 (NVIDIA's Ubuntu 24.04 has 3.12, Debian 12 3.11),
so this image also shows the kit, Horovod and horovodrun on a Python without distutils.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.cli.test_install_script import pins
from tests.container.conftest import TF_CI_CC, build_tools_left, image_bytes, in_image, static_archives
from tests.multiproc.test_examples_quiet import WARNING

pytestmark = [pytest.mark.container, pytest.mark.timeout(3300)]
VENV = "/opt/hvdkit/venv"
# Measured 7.35 GB on the Debian 13 stand-in: the venv is 6.5 GB, of it TensorFlow's CUDA 12 wheels 4.2 GB
# (cuDNN 1.1, cuBLAS 0.8, cuSOLVER 0.5, NCCL 0.5, cuSPARSE 0.5, cuFFT 0.3, NVRTC 0.2, ...), all of which
# tensorflow[and-cuda] requires; the torch image's bound is 6.5 GB.
MAX_IMAGE_BYTES = 7.5e9


def test_the_tf_image_reports_tensorflow_on_cuda_12_and_horovod_with_nccl(engine, tf_image):
    p = pins()
    report = json.loads(in_image(engine, tf_image, "hvdkit", "env", "--json").stdout)
    hb = report["horovod"]
    assert hb is not None, report["horovod_error"]
    assert hb["frameworks"] == {"torch": False, "tensorflow": True}, hb["frameworks"]
    assert hb["tensor_operations"]["nccl"] and hb["cuda_built"], hb
    assert hb["controllers"] == {"mpi": True, "gloo": True}
    assert report["packages"]["tensorflow"] == p["TENSORFLOW_VERSION"] and report["packages"]["torch"] is None
    assert (report["tensorflow_cuda"] or "").split(".")[0] == p["TF_CUDA_MAJOR"], report["tensorflow_cuda"]
    assert report["tensorflow_cuda_wheels"], "tensorflow[and-cuda]'s CUDA 12 wheels are missing"
    assert report["python"].startswith("3.13"), report["python"]
    # NCCL is TensorFlow's own nvidia-nccl-cu12 wheel.
    wheel_nccl = in_image(engine, tf_image, f"{VENV}/bin/python", "-c",
                          "import importlib.metadata as m; print(m.version('nvidia-nccl-cu12'))").stdout.strip()
    assert wheel_nccl.startswith(hb["nccl_version"]), (wheel_nccl, hb["nccl_version"])
    # The kernels of the build argument, read from the library's fatbin.
    assert hb["cuda_arches"]["sass"] == [int(TF_CI_CC)], hb["cuda_arches"]
    env = in_image(engine, tf_image, "env").stdout
    assert "KERAS_BACKEND=tensorflow" in env, env
    # horovodrun's own view (patch item 18: it reported PyTorch in a build without it).
    check = in_image(engine, tf_image, "horovodrun", "--check-build").stdout
    assert re.search(r"\[X\] TensorFlow", check) and re.search(r"\[ \] PyTorch", check), check
    assert re.search(r"\[X\] NCCL", check) and re.search(r"\[X\] Gloo", check), check


def test_one_nccl_and_one_cuda_runtime_both_tensorflows(engine, tf_image):
    site = in_image(engine, tf_image, f"{VENV}/bin/python", "-c",
                    "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    ldd = in_image(engine, tf_image, "sh", "-c", f"ldd {site}/horovod/tensorflow/mpi_lib*.so").stdout
    match = re.search(r"libnccl\.so\.2 => (\S+)", ldd)
    assert match and match.group(1) == f"{site}/nvidia/nccl/lib/libnccl.so.2", ldd
    # TensorFlow's own libraries resolve once TensorFlow is imported (horovod.tensorflow imports it first).
    missing = [line for line in ldd.splitlines() if "not found" in line and "libtensorflow" not in line]
    assert missing == [], ldd
    out = in_image(engine, tf_image, f"{VENV}/bin/python", "-c",
                   "import json, os, sysconfig, tensorflow, horovod.tensorflow as hvd\n"
                   "hvd.init()\n"
                   "maps = open('/proc/self/maps').read().split('\\n')\n"
                   "print(json.dumps([sysconfig.get_paths()['purelib'],"
                   " sorted({os.path.realpath(l.split()[-1]) for l in maps if '/' in l})]))").stdout
    site, loaded = json.loads(out.strip().splitlines()[-1])
    nccl = [p for p in loaded if re.search(r"/libnccl\.so", p)]
    cudart = [p for p in loaded if re.search(r"/libcudart\.so", p)]
    assert nccl == [f"{site}/nvidia/nccl/lib/libnccl.so.2"], nccl
    # Horovod links the CUDA runtime statically (its CMake default); the one shared copy is TensorFlow's.
    assert cudart == [f"{site}/nvidia/cuda_runtime/lib/libcudart.so.12"], cudart


def test_the_tf_runtime_image_has_no_compilers_or_cuda_toolkit(engine, tf_image):
    # TensorFlow's own ptxas (nvidia-cuda-nvcc-cu12) stays: XLA assembles its kernels with it at run time.
    found = build_tools_left(engine, tf_image, keep="*/site-packages/nvidia/cuda_nvcc/bin/ptxas")
    assert found == [], f"build tools left in the runtime image: {found}"
    assert static_archives(engine, tf_image) == 0


def test_the_tf_image_size_stays_under_7_5_gb(engine, tf_image):
    size = image_bytes(engine, tf_image, "tf_image_bytes", "Debian 13")
    assert size <= MAX_IMAGE_BYTES, f"{size / 1e9:.2f} GB > {MAX_IMAGE_BYTES / 1e9} GB"


@pytest.mark.parametrize("controller", ["", "--gloo"], ids=["launch-default", "gloo"])
def test_the_keras_example_runs_unmodified_on_two_ranks_in_each_image(engine, image, tf_image, controller):
    """examples/keras_mnist.py as shipped (its backend: the image's KERAS_BACKEND), 2 ranks on the CPU, under
    hvdkit launch's default controller (MPI on one host) and under --gloo."""
    for tag, backend in ((tf_image, "tensorflow"), (image, "torch")):
        run = engine.docker("run", "--rm", "--network", "host", "--entrypoint", "", tag, "sh", "-c",
                            f"hvdkit launch -np 2 {controller} python examples/keras_mnist.py --epochs 3 --json 2>&1",
                            timeout=900, check=False)
        out = run.stdout or ""
        assert run.returncode == 0, (tag, controller, out[-4000:])
        assert not WARNING.findall(out), (tag, WARNING.findall(out))
        # Under MPI each line carries the rank's tag ("[1,0]<stdout>:"): the JSON is the line's tail.
        match = re.search(r'(\{"dataset".*\})', out)
        assert match, (tag, out[-4000:])
        final = json.loads(match.group(1))
        assert final["backend"] == backend and final["size"] == 2, final
        assert final["test_accuracy"] >= 0.85, final
