"""Worker: a short training loop in which one rank can be made slow on purpose (a sleep before each backward).

Used by the timeline test (the slow rank must come out as late to negotiation) and by the
straggler test (hk.evaluate's per-epoch line must name it, and say nothing when the ranks are even or
when only another process on its core slows one rank).
"""

import argparse
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from rank_results import write_result
from torch.utils.data import TensorDataset
from torch_common import SmallNet

import hvdkit.torch as hk
from hvdkit.runtime.stragglers import core_wait_s

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--slow-rank", type=int, default=-1, help="the rank that sleeps before each backward")
p.add_argument("--sleep-ms", type=float, default=40.0)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--samples", type=int, default=320)
p.add_argument("--busy-ms", type=float, default=0.0, help="CPU work every rank does before each backward")
p.add_argument("--hogs", type=int, default=0,
               help="rank r runs on CPU r alone, and rank 0 starts this many busy processes on CPU 0 beside it")
args = p.parse_args()

ctx = hk.init(seed=0, threads=1)
hogs = []
if args.hogs:
    for thread in os.listdir("/proc/self/task"):            # Horovod's and Gloo's threads too
        os.sched_setaffinity(int(thread), {ctx.rank})
    if ctx.rank == 0:
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    waited_at_start = core_wait_s()
g = torch.Generator().manual_seed(0)
n = args.samples
data = TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))
loader = hk.distributed_loader(data, 16, shuffle=True)
model = SmallNet()
optimizer = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=hk.scale_lr(0.01)), model)
hk.broadcast_state(model, optimizer)
for epoch in range(args.epochs):
    loader.sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        if ctx.rank == args.slow_rank:
            time.sleep(args.sleep_ms / 1e3)
        busy_until = time.thread_time() + args.busy_ms / 1e3
        while time.thread_time() < busy_until:
            pass
        loss.backward()
        optimizer.step()
    metrics = hk.evaluate(model, hk.eval_loader(data, batch_size=64))
result = {"size": ctx.size, "metrics": metrics}
if args.hogs:
    result["core_wait_s"] = core_wait_s() - waited_at_start
for hog in hogs:
    hog.kill()
    hog.wait()
write_result(args.out, ctx.rank, result)
