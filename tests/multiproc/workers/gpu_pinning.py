"""Worker: GPU pinning without a GPU, by faking the device queries both adapters make.

--framework torch | keras-torch: torch.cuda.is_available/device_count/
get_device_properties(i).uuid/set_device are replaced, so hk.init() takes its
GPU branch and we record what it pinned.
--framework keras-tensorflow: tf.config.list_physical_devices("GPU") returns
fake devices and the CUDA driver library (where hvdkit reads TensorFlow's GPU
UUIDs) is a fake; set_memory_growth and set_visible_devices are recorded.
--gpus N: every rank sees the same N GPUs (a host that shows all its GPUs).
--uuids a,b (once per rank, in rank order): the GPUs this rank sees, one hex
letter per GPU standing for its UUID (GPU-aaaaaaaa-...), "" for none; --cvd,
once per rank, sets the rank's CUDA_VISIBLE_DEVICES ("unset" removes it).
--driver V: a host with /dev/nvidia0 and driver V (a fake /dev and /proc) on
which CUDA is unusable. The CPU build's Horovod has no NCCL, so the worker sets
HVDKIT_GPU_WITHOUT_NCCL=1 unless --nccl-check. --shm-mib N: /dev/shm reads as N MiB (a fake
os.statvfs for that path), as in a plain `docker run`. --device cpu: HVDKIT_DEVICE=cpu, set here
rather than in the job's environment so that the pool's key does not change (hk.init reads it each time).

Writes rank<R>.json with the device string and what was pinned, or the error.
Every fake is undone at the end, so the worker can run as a job pool's scenario
(tests/job_pool.py), whose next scenario must find the real modules.
"""

import argparse
import os
from contextlib import ExitStack
from types import SimpleNamespace
from unittest import mock

from rank_results import write_result

from hvdkit.common.errors import UserError
from hvdkit.common.launcher import detect

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--framework", choices=["torch", "keras-torch", "keras-tensorflow"], required=True)
p.add_argument("--gpus", type=int, default=0)
p.add_argument("--uuids", action="append")
p.add_argument("--cvd", action="append")
p.add_argument("--driver")
p.add_argument("--nccl-check", action="store_true", help="keep hk.init()'s refusal of a Horovod without NCCL")
p.add_argument("--shm-mib", type=int)
p.add_argument("--device", help="HVDKIT_DEVICE for this scenario (the pool restores the environment after it)")
args = p.parse_args()
fakes = ExitStack()


def fake(owner, name: str, value) -> None:
    fakes.enter_context(mock.patch.object(owner, name, value))


if args.shm_mib is not None:
    real_statvfs = os.statvfs

    def small_shm(path):
        if path != "/dev/shm":
            return real_statvfs(path)
        blocks = args.shm_mib * 256     # 4 KiB blocks
        return os.statvfs_result((4096, 4096, blocks, blocks, blocks, 0, 0, 0, 0, 255))

    fake(os, "statvfs", small_shm)
if args.device:
    os.environ["HVDKIT_DEVICE"] = args.device
if not args.nccl_check:
    os.environ["HVDKIT_GPU_WITHOUT_NCCL"] = "1"   # this CPU machine's Horovod has no NCCL; the GPUs are fakes
rank = detect().rank                    # before hk.init, as the launcher said
letters = [c for c in args.uuids[rank].split(",") if c] if args.uuids else "abcdefgh"[:args.gpus]
uuids = [f"GPU-{c * 8}-{c * 4}-{c * 4}-{c * 4}-{c * 12}" for c in letters]
if args.cvd and args.cvd[rank] == "unset":
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
elif args.cvd:
    os.environ["CUDA_VISIBLE_DEVICES"] = args.cvd[rank]
calls = []


class FakeLibcuda:
    """The CUDA driver calls hvdkit.runtime.cuda_driver makes (arguments are ctypes byref()s), for the fake GPUs."""

    def cuInit(self, flags):
        return 0

    def cuDeviceGetCount(self, count):
        count._obj.value = len(uuids)
        return 0

    def cuDeviceGet(self, device, ordinal):
        device._obj.value = ordinal
        return 0

    def cuDeviceGetUuid_v2(self, uuid, device):
        uuid._obj.bytes[:] = list(bytes.fromhex(letters[device.value] * 32))
        return 0


if args.driver:
    # A GPU host whose CUDA the framework cannot use: /dev/nvidia0 and an old driver in /proc.
    from hvdkit.runtime import cuda_driver

    host = os.path.join(args.out, f"host-of-rank{rank}")
    os.makedirs(os.path.join(host, "dev"))
    open(os.path.join(host, "dev", "nvidia0"), "w").close()
    with open(os.path.join(host, "version"), "w") as f:
        f.write(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {args.driver}  Sat Aug 19 01:15:15 UTC 2023\n")
    fake(cuda_driver, "DEV_DIR", os.path.join(host, "dev"))
    fake(cuda_driver, "DRIVER_VERSION_FILE", os.path.join(host, "version"))

if args.framework == "keras-tensorflow":
    os.environ["KERAS_BACKEND"] = "tensorflow"
    from collections import namedtuple

    import tensorflow as tf

    from hvdkit.runtime import cuda_driver

    # On (fake) GPUs hk.init leaves TensorFlow's threads alone and starts its runtime, which keeps that count for
    # the rest of the process: in a pool, a later scenario's hk.init(threads=1) would then be refused. Started
    # with 1, as every other pooled TensorFlow scenario asks.
    if tf.config.threading.get_intra_op_parallelism_threads() != 1:
        tf.config.threading.set_intra_op_parallelism_threads(1)
    if args.driver:
        fake(tf.sysconfig, "get_build_info", lambda: {"is_cuda_build": True, "cuda_version": "12.5.1"})   # TF 2.21
    Fake = namedtuple("PhysicalDevice", "name device_type")
    gpus = [Fake(f"/physical_device:GPU:{i}", "GPU") for i in range(len(uuids))]
    real_list = tf.config.list_physical_devices
    fake(tf.config, "list_physical_devices", lambda kind=None: list(gpus) if kind == "GPU" else real_list(kind))
    fake(tf.config.experimental, "set_memory_growth", lambda dev, on: calls.append(["memory_growth", dev.name, on]))
    fake(tf.config, "set_visible_devices", lambda dev, kind=None: calls.append(
        ["visible", [d.name for d in dev] if isinstance(dev, list) else dev.name, kind]))
    fake(cuda_driver, "load_libcuda", FakeLibcuda)
else:
    if args.framework == "keras-torch":
        os.environ["KERAS_BACKEND"] = "torch"
    import torch

    if args.framework == "keras-torch":
        # Keras on torch picks its default device once, as it is first imported: before the fakes here, as it is
        # where a pool imported it earlier, then faked to what a process started with these GPUs would have.
        from keras.src.backend.torch import core as keras_torch_core

        fake(keras_torch_core, "DEFAULT_DEVICE", "cuda" if uuids else "cpu")

    if args.driver:
        fake(torch.version, "cuda", "13.0")   # the build hvdkit installs (torch 2.14.1+cu130)
    fake(torch.cuda, "is_available", lambda: bool(uuids))
    fake(torch.cuda, "device_count", lambda: len(uuids))
    # torch prints a UUID without nvidia-smi's "GPU-" (torch._C._CUuuid.__str__)
    fake(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=uuids[i][len("GPU-"):]))
    fake(torch.cuda, "set_device", lambda index: calls.append(["set_device", index]))

if args.framework == "torch":
    import hvdkit.torch as hk
else:
    import hvdkit.keras as hk

with fakes:
    try:
        ctx = hk.init()
        result = {"device": str(ctx.device), "gpu": ctx.gpu, "calls": calls, "rank": ctx.rank, "size": ctx.size}
        if args.framework == "keras-torch":      # where Keras on torch puts new variables
            from keras.src.backend.torch.core import get_device

            result["keras_device"] = str(get_device())
    except (RuntimeError, UserError) as exc:      # NoGPUError is a UserError; torch raises RuntimeError
        result = {"error": str(exc), "calls": calls}
write_result(args.out, rank, result)
