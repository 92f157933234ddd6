"""Worker: GPU pinning without a GPU, by faking the framework's device queries (the seam both adapters use).

--framework torch | keras-torch: torch.cuda.is_available/device_count/set_device
are replaced, so hk.init() takes its GPU branch and we record what it pinned.
--framework keras-tensorflow: tf.config.list_physical_devices("GPU") returns
fake devices; set_memory_growth and set_visible_devices are recorded.
--gpus N: how many GPUs this host shows (after CUDA_VISIBLE_DEVICES).

Writes rank<R>.json with the device string and what was pinned, or the error.
"""

import argparse
import json
import os

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--framework", choices=["torch", "keras-torch", "keras-tensorflow"], required=True)
p.add_argument("--gpus", type=int, required=True)
args = p.parse_args()
calls = []

if args.framework == "keras-tensorflow":
    os.environ["KERAS_BACKEND"] = "tensorflow"
    from collections import namedtuple

    import tensorflow as tf

    Fake = namedtuple("PhysicalDevice", "name device_type")
    gpus = [Fake(f"/physical_device:GPU:{i}", "GPU") for i in range(args.gpus)]
    real_list = tf.config.list_physical_devices
    tf.config.list_physical_devices = lambda kind=None: list(gpus) if kind == "GPU" else real_list(kind)
    tf.config.experimental.set_memory_growth = lambda dev, on: calls.append(["memory_growth", dev.name, on])
    tf.config.set_visible_devices = lambda dev, kind=None: calls.append(["visible", dev.name, kind])
else:
    if args.framework == "keras-torch":
        os.environ["KERAS_BACKEND"] = "torch"
    import torch

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: args.gpus
    torch.cuda.set_device = lambda index: calls.append(["set_device", index])

if args.framework == "torch":
    import hvdkit.torch as hk
else:
    import hvdkit.keras as hk

try:
    ctx = hk.init()
    result = {"device": str(ctx.device), "gpu": ctx.gpu, "calls": calls, "rank": ctx.rank, "size": ctx.size}
except RuntimeError as exc:
    result = {"error": str(exc), "calls": calls}
rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
