"""Stands in for examples/pytorch_mnist.py in a Slurm GPU job on hosts without GPUs.

The test's stand-in venv python runs this in place of the example, with the
example's arguments. It fakes torch.cuda from the CUDA_VISIBLE_DEVICES that
Slurm (or horovodrun) gave this process, the way the multi-process worker
tests/multiproc/workers/gpu_pinning.py fakes it: device i is visible entry i,
with UUID "GPU-fake-<host>-<entry>", so two ranks sharing a GPU see the same UUID.
Then it calls hk.init() and writes rank<R>.json into $SLURM_GPU_TASK_OUT: what
Slurm set, what hvdkit pinned (or the error), the argv the batch script passed,
and the step's TRES per task as slurmctld recorded it.
"""

import os
import socket
import subprocess
import sys
import traceback
from types import SimpleNamespace

import torch

from tests.multiproc.workers.rank_results import write_result  # PYTHONPATH has the checkout (job_env)

host = socket.gethostname()
visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
calls = []
torch.cuda.is_available = lambda: bool(visible)
torch.cuda.device_count = lambda: len(visible)
torch.cuda.get_device_properties = lambda i: SimpleNamespace(
    uuid=f"GPU-fake-{host}-{visible[int(i)]}", name="fake GPU", total_memory=80 << 30, major=9, minor=0)
torch.cuda.set_device = lambda index: calls.append(["set_device", int(index)])

os.environ["HVDKIT_GPU_WITHOUT_NCCL"] = "1"      # the test hosts' Horovod is the CPU build; the GPUs are fakes
import hvdkit.torch as hk  # noqa: E402  (after the fakes, as a training script imports it)

result = {"host": host, "argv": sys.argv[1:], "calls": calls,
          "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS",
                                                 "SLURM_PROCID", "SLURM_LOCALID", "NCCL_SOCKET_IFNAME",
                                                 "HOROVOD_GLOO_IFACE", "OMPI_MCA_btl_tcp_if_include")}}
try:
    ctx = hk.init()
    result.update(rank=ctx.rank, size=ctx.size, local_rank=ctx.local_rank, local_size=ctx.local_size,
                  gpu=ctx.gpu, device=str(ctx.device))
except (RuntimeError, hk.UserError) as exc:   # hvdkit's NoGPUError and friends: recorded, asserted by the test
    import horovod.torch as hvd

    result.update(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
                  error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc())
if os.environ.get("SLURM_STEP_ID"):    # a task srun started: how slurmctld recorded the step
    step = subprocess.run(["scontrol", "show", "step", f"{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"],
                          capture_output=True, text=True, timeout=30).stdout
    result["step"] = dict(field.split("=", 1) for field in step.split() if "=" in field)
write_result(os.environ["SLURM_GPU_TASK_OUT"], result["rank"], result)
