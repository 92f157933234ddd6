"""What the NVIDIA driver tells hvdkit before a rank pins a GPU, read without torch or TensorFlow.

Two questions, both asked by the adapters' ``init()``:

- :func:`check_cuda_usable`: the host has NVIDIA GPUs, yet the framework
  cannot use CUDA (most often a driver older than the framework's CUDA
  needs). Training would silently run on the CPU, so stop and say why.
- :func:`visible_gpu_uuids`: the UUIDs of the GPUs that CUDA shows this
  process, in CUDA's order, through the CUDA driver library (``libcuda``).
  TensorFlow has no UUID API (``tf.config.experimental.get_device_details``
  returns only ``device_name`` and ``compute_capability``), so the Keras
  adapter asks the library that TensorFlow's runtime itself loads; it reads
  CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER the same way, so index i here is
  TensorFlow's ``GPU:i``. torch has its own (``get_device_properties(i).uuid``).

The paths and the library are module attributes, read at each call, so that
tests can point them at a fake ``/dev`` and ``/proc`` (``tests/unit/test_gpu_choice.py``,
``tests/multiproc/workers/gpu_pinning.py``).

Example::

    check_cuda_usable(torch.cuda.is_available(), framework="torch", cuda_build=torch.version.cuda)
    visible_gpu_uuids()     # ['GPU-5a1f...', 'GPU-9c0e...'], or None where libcuda cannot tell
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
from collections.abc import Mapping

from hvdkit.common import launcher
from hvdkit.runtime.topology import NoGPUError, hides_all_gpus

DEV_DIR = "/dev"
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
LIBCUDA = "libcuda.so.1"

# The oldest driver branch each CUDA major release runs on: NVIDIA's "CUDA Toolkit and Minimum Driver
# Version for Minor Version Compatibility" table (docs.nvidia.com/deploy/cuda-compatibility).
MIN_DRIVER = {11: 450, 12: 525, 13: 580}
_NVIDIA_DEVICE = re.compile(r"nvidia\d+")
_NVRM_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)")


def gpu_evidence(dev_dir: str | None = None, which=shutil.which) -> str | None:
    """What shows this host has NVIDIA GPUs: its first ``/dev/nvidiaN``, else ``nvidia-smi`` on PATH; or None."""
    dev_dir = dev_dir or DEV_DIR
    try:
        devices = sorted(name for name in os.listdir(dev_dir) if _NVIDIA_DEVICE.fullmatch(name))
    except OSError:
        devices = []
    if devices:
        return os.path.join(dev_dir, devices[0])
    return "nvidia-smi on PATH" if which("nvidia-smi") else None


def gpus_asked_for(environ: Mapping[str, str]) -> str | None:
    """The setting that shows GPUs were asked for this process, or None.

    ``NVIDIA_VISIBLE_DEVICES`` naming devices (the Kubernetes device plugin sets
    it for a ``nvidia.com/gpu`` request, a user for ``docker run -e``; CUDA
    base images default it to ``all``, which asks for nothing), or a Slurm
    GPU allocation (:func:`hvdkit.common.launcher.slurm_job`'s ``gpus``).
    """
    nvidia = environ.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if nvidia and nvidia.lower() not in ("all", "void", "none"):
        return f"NVIDIA_VISIBLE_DEVICES={nvidia}"
    job = launcher.slurm_job(environ)
    return job.gpus if job else None


def in_container() -> bool:
    """Whether this process runs in a container (Docker's or Podman's marker file, or Kubernetes's variable)."""
    return os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv") or \
        "KUBERNETES_SERVICE_HOST" in os.environ


def driver_version(version_file: str | None = None) -> str | None:
    """The loaded kernel driver's version ("580.65.06") from /proc/driver/nvidia/version; None if unreadable."""
    try:
        with open(version_file or DRIVER_VERSION_FILE) as f:
            text = f.read()
    except OSError:
        return None
    match = _NVRM_VERSION.search(text)
    return match.group(1) if match else None


def check_cuda_usable(usable: bool, framework: str, cuda_build: str | None,
                      environ: Mapping[str, str] | None = None, dev_dir: str | None = None,
                      version_file: str | None = None, which=shutil.which) -> None:
    """Raise :class:`NoGPUError` when this host has NVIDIA GPUs that ``framework`` cannot use.

    ``usable`` is the framework's own answer (``torch.cuda.is_available()``, or
    TensorFlow listing a GPU); ``cuda_build`` the CUDA version it was built for
    ("13.0"; None for a CPU-only build). No error when the framework can use
    CUDA, when no GPU is present, or when CUDA_VISIBLE_DEVICES hides every GPU
    (empty, ``-1``: the user chose the CPU). With no GPU at all, an error
    still when GPUs were asked for (:func:`gpus_asked_for`): a pod or
    container started without the NVIDIA runtime, which would train on the CPU.

    Example::

        check_cuda_usable(False, "torch", "13.0")
        # NoGPUError: NVIDIA GPU(s) found (/dev/nvidia0) but torch cannot use CUDA: driver 550.54.15 is older
        # than 580, the minimum for CUDA 13 (torch is built for CUDA 13.0); upgrade the NVIDIA driver to 580 or
        # newer, or set HVDKIT_DEVICE=cpu to train on the CPU deliberately
    """
    environ = os.environ if environ is None else environ
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if usable or hides_all_gpus(cvd) or launcher.slurm_gave_no_gpu(environ):
        return
    cpu = "or set HVDKIT_DEVICE=cpu to train on the CPU deliberately"
    evidence = gpu_evidence(dev_dir, which)
    if evidence is None:
        asked = gpus_asked_for(environ)
        slurm = launcher.slurm_job(environ)
        if asked and slurm and asked == slurm.gpus:
            raise NoGPUError(f"GPUs were asked for ({asked}) but this node shows none ({dev_dir or DEV_DIR} has no "
                             f"nvidia device, no nvidia-smi on PATH): check its NVIDIA driver and Slurm's gres.conf "
                             f"there (nvidia-smi), {cpu}")
        if asked:
            raise NoGPUError(f"GPUs were asked for ({asked}) but this {'container' if in_container() else 'host'} "
                             f"has none ({dev_dir or DEV_DIR} has no nvidia device, no nvidia-smi on PATH): start it "
                             f"with its GPUs (docker run --gpus all; on Kubernetes runtimeClassName: nvidia where "
                             f"nvidia is not the default runtime) and check the node's driver with nvidia-smi, {cpu}")
        return
    found = f"NVIDIA GPU(s) found ({evidence}) but {framework} cannot use CUDA"
    if cvd is not None:
        found += f" (CUDA_VISIBLE_DEVICES={cvd})"
    if cuda_build is None and framework == "TensorFlow":
        raise NoGPUError(f"{found}: this TensorFlow is a CPU-only build (tensorflow-cpu); use hvdkit's TensorFlow "
                         f"GPU flavour (scripts/install.sh --gpu-tf, or Dockerfile.gpu with --build-arg "
                         f"FLAVOUR=tensorflow), {cpu}")
    if cuda_build is None:
        raise NoGPUError(f"{found}: this {framework} is a CPU-only build; install its CUDA build "
                         f"(scripts/install.sh --gpu), {cpu}")
    major = int(cuda_build.split(".")[0])
    minimum = MIN_DRIVER.get(major)
    need = (f"the minimum for CUDA {major} ({framework} is built for CUDA {cuda_build})" if minimum
            else f"CUDA {cuda_build}")
    driver = driver_version(version_file)
    if driver is None:
        raise NoGPUError(f"{found} and the driver version is unknown ({version_file or DRIVER_VERSION_FILE} "
                         f"is unreadable): {framework} needs driver {minimum or '?'} or newer, {need}; check "
                         f"`nvidia-smi` and upgrade the NVIDIA driver, {cpu}")
    if minimum is not None and int(driver.split(".")[0]) < minimum:
        raise NoGPUError(f"{found}: driver {driver} is older than {minimum}, {need}; upgrade the NVIDIA driver to "
                         f"{minimum} or newer, {cpu}")
    raise NoGPUError(f"{found} although driver {driver} is new enough ({minimum or '?'} or newer, {need}): check "
                     f"`nvidia-smi`, that this container was started with its GPUs (docker --gpus all) and that "
                     f"{framework}'s CUDA libraries are installed, {cpu}")


class _CUuuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


def load_libcuda():
    """The CUDA driver library, or None where it is not installed (a CPU host)."""
    try:
        return ctypes.CDLL(LIBCUDA)
    except OSError:
        return None


def visible_gpu_uuids(lib=None) -> list[str] | None:
    """The UUIDs ("GPU-" and 32 hex digits) of the GPUs CUDA shows this process, in CUDA's order.

    None when the driver library is missing or any call fails; the caller
    then falls back to CUDA_VISIBLE_DEVICES (:meth:`hvdkit.runtime.topology.GPUView.gpus`).
    ``cuDeviceGetUuid_v2`` (CUDA 11.4) gives a MIG slice its own UUID; the
    first version gives the parent GPU's.
    """
    lib = lib if lib is not None else load_libcuda()
    if lib is None or lib.cuInit(0) != 0:
        return None
    get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or getattr(lib, "cuDeviceGetUuid", None)
    count = ctypes.c_int()
    if get_uuid is None or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    uuids = []
    for ordinal in range(count.value):
        device, raw = ctypes.c_int(), _CUuuid()
        if lib.cuDeviceGet(ctypes.byref(device), ordinal) != 0 or get_uuid(ctypes.byref(raw), device) != 0:
            return None
        uuids.append(format_uuid(bytes(raw.bytes)))
    return uuids


def format_uuid(raw: bytes) -> str:
    """16 bytes as nvidia-smi prints a GPU's UUID: ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def torch_gpu_uuids(torch) -> list[str | None]:
    """The UUIDs of ``cuda:0..n-1`` as torch reports them (already filtered by CUDA_VISIBLE_DEVICES).

    Takes the torch module so the core stays framework-free; both adapters' torch paths use it.

    Example::

        torch_gpu_uuids(torch)      # ['GPU-5a1f...'] under srun --gpus-per-task=1
    """
    return [getattr(torch.cuda.get_device_properties(i), "uuid", None) for i in range(torch.cuda.device_count())]
