"""Worker: host memory of a sharded checkpoint's save, per rank (issue 39, at a real size).

A 64M-parameter model (256 MiB in float32) with Adam, shard_optimizer_state=True: 512 MiB of state in all,
1/size of it on each rank. One step, then hk.save_checkpoint. Each rank reports how far its resident memory
peaked above where it stood before the save (Linux: clear_refs resets VmHWM), the state's bytes, and how
long the save took; rank 0 also what the file holds, and, after the save, how long the gather onto every rank
that an elastic commit does took beside one step (the best of 3 each).
"""

import argparse
import os
import time

import torch
from rank_results import write_result

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--ckpt", required=True)
p.add_argument("--mparams", type=int, default=64)
args = p.parse_args()


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


ctx = hk.init(seed=1, threads=1)
n = args.mparams * 2**20
model = torch.nn.Module()
model.weight = torch.nn.Parameter(torch.zeros(n // 1024, 1024))
model.bias = torch.nn.Parameter(torch.zeros(1024))
optimizer = hk.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3), model, shard_optimizer_state=True)
hk.broadcast_state(model, optimizer)
model.weight.grad = None
(model.weight.sum() + model.bias.sum()).backward()
optimizer.step()
state_bytes = 2 * 4 * (n + 1024)                      # Adam's two moments, float32

with open("/proc/self/clear_refs", "w") as f:          # VmHWM := VmRSS from here
    f.write("5")
before = status_kib("VmRSS")
started = time.perf_counter()
wrote = hk.save_checkpoint(args.ckpt, model, optimizer, epoch=0)
seconds = time.perf_counter() - started
peak = status_kib("VmHWM")
result = {"rank": ctx.rank, "size": ctx.size, "wrote": wrote, "state_bytes": state_bytes,
          "peak_growth_bytes": (peak - before) * 1024, "save_seconds": round(seconds, 2)}
if wrote:
    body = torch.load(args.ckpt, map_location="cpu", weights_only=True, mmap=True)
    moments = body["optimizer"]["state"]
    result["moments"] = [list(moments[i][k].shape) for i in (0, 1) for k in ("exp_avg", "exp_avg_sq")]
    result["file_bytes"] = os.path.getsize(args.ckpt)
    gathers, steps = [], []
    for _ in range(3):
        started = time.perf_counter()
        optimizer.state_dict()
        gathers.append(time.perf_counter() - started)
        started = time.perf_counter()
        optimizer.zero_grad()
        (model.weight.sum() + model.bias.sum()).backward()
        optimizer.step()
        steps.append(time.perf_counter() - started)
    result.update(commit_gather_seconds=round(min(gathers), 3), step_seconds=round(min(steps), 3))
else:
    for _ in range(3):
        optimizer.state_dict()
        optimizer.zero_grad()
        (model.weight.sum() + model.bias.sum()).backward()
        optimizer.step()
write_result(args.out, ctx.rank, result)
