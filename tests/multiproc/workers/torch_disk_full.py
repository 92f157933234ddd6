"""Worker: the checkpoint's disk fills up from elsewhere after the pre-flight check (or, with --fault read-only, is
remounted read-only, as after a storage fault); rank 0's save must fail with one CheckpointError naming the cause,
not torch's RuntimeError (issue 34, case 4)."""

import argparse
import os
import shutil
import subprocess

import torch
from rank_results import write_result

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--ckpt", required=True)
p.add_argument("--background", action="store_true", help="save_checkpoint(blocking=False), then wait for it")
p.add_argument("--fault", choices=("full", "read-only"), default="full")
args = p.parse_args()

ctx = hk.init(seed=0, threads=1)
model = torch.nn.Linear(1024, 1024)                          # 4 MiB of weights
optimizer = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
hk.broadcast_state(model, optimizer)
hk.check_checkpoint_path(args.ckpt, model)                   # passes: the disk is still empty
directory = os.path.dirname(args.ckpt)
if ctx.is_main and args.fault == "full":                     # another job fills the disk, leaving 1 MiB
    with open(os.path.join(directory, "filler"), "wb") as f:
        f.write(b"\0" * (shutil.disk_usage(directory).free - 2**20))
elif ctx.is_main:                                            # root, as the tests run
    subprocess.run(["mount", "-o", "remount,ro", directory], check=True)
error = None
try:
    hk.save_checkpoint(args.ckpt, model, optimizer, blocking=not args.background)
    if args.background:     # the write's error reaches the training thread when it waits for the write
        hk.wait_for_checkpoint()
except Exception as exc:  # noqa: BLE001 - the test reads the type and message
    error = f"{type(exc).__name__}: {exc}"
write_result(args.out, ctx.rank, {"size": ctx.size, "error": error,
                                  "files": sorted(os.listdir(os.path.dirname(args.ckpt)))})
