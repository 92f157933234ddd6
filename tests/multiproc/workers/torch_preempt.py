"""Worker: training with hk.PreemptionGuard; a signal mid-epoch gives a checkpoint at the step boundary.

Rank r writes pid<r> (so the test can signal one rank) and, on rank 0, the
number of steps done to progress. With --resume it continues from the
checkpoint's (epoch, batch). The final parameters go to rank<r>.json.
--background saves after every step with blocking=False, so a save is in flight when the signal comes.
"""

import argparse
import os
import time

import torch
from rank_results import write_result
from torch.utils.data import TensorDataset

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--ckpt", required=True)
p.add_argument("--resume", action="store_true")
p.add_argument("--step-seconds", type=float, default=0.0, help="slow each step so a signal lands mid-epoch")
p.add_argument("--save-delay-s", type=float, default=0.0,
               help="rank 0 takes this much longer in its save (a slow file system), after which it writes")
p.add_argument("--ballast-mb", type=int, default=0,
               help="a buffer of this size in the model, so the checkpoint takes seconds to write (not trained)")
p.add_argument("--background", action="store_true",
               help="save after every step with blocking=False (one is always in flight), the preemption's too")
p.add_argument("--slow-background-s", type=float, default=0.0,
               help="the preemption's background write first waits this long (a slow file system)")
args = p.parse_args()

preempting = False
if args.slow_background_s:
    import hvdkit.runtime.checkpoint as core

    def slow_save_to(*a, _save_to=core.save_to, **kw):
        if preempting:                  # the preemption's save, not the periodic ones
            time.sleep(args.slow_background_s)
        return _save_to(*a, **kw)

    core.save_to = slow_save_to

ctx = hk.init(seed=1, threads=1)
torch.set_default_dtype(torch.float64)
with open(os.path.join(args.out, f"pid{ctx.rank}"), "w") as f:
    f.write(str(os.getpid()))

g = torch.Generator().manual_seed(0)
x = torch.randn(240, 6, generator=g)
y = x @ torch.randn(6, 1, generator=g) + 0.1 * torch.randn(240, 1, generator=g)
loader = hk.distributed_loader(TensorDataset(x, y), batch_size=8, shuffle=True, seed=3)
torch.manual_seed(5)   # the same initial weights on every rank (and broadcast anyway)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
if args.ballast_mb:
    model.register_buffer("ballast", torch.ones(args.ballast_mb * 2**20 // 4, dtype=torch.float32))
optimizer = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model)
guard = hk.PreemptionGuard()

EPOCHS, per_epoch = 3, len(loader)
epoch, start_batch = 0, 0
if args.resume:
    extra = hk.load_checkpoint(args.ckpt, model, optimizer)
    epoch, start_batch = extra["epoch"], extra["batch"]
    if start_batch >= per_epoch:
        epoch, start_batch = epoch + 1, 0
else:
    hk.broadcast_state(model, optimizer)
resumed_at = [epoch, start_batch]

steps = 0
while epoch < EPOCHS:
    loader.sampler.set_epoch(epoch, start_batch=start_batch)
    for batch, (xb, yb) in enumerate(loader, start=start_batch):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        optimizer.step()
        steps += 1
        if ctx.is_main:
            with open(os.path.join(args.out, "progress"), "w") as f:
                f.write(f"{epoch} {batch + 1}")
        time.sleep(args.step_seconds)
        if args.background:       # waits for the save in flight, then copies and returns
            hk.save_checkpoint(args.ckpt, model, optimizer, epoch=epoch, batch=batch + 1, blocking=False)
        if guard.requested():
            preempting = True
            write_result(args.out, ctx.rank, {"epoch": epoch, "batch": batch + 1, "signal": guard.received},
                         prefix="preempted")
            if args.save_delay_s:           # the recipe: every rank waits for rank 0's outcome before exiting

                def slow_save(epoch, batch):
                    if ctx.is_main:
                        time.sleep(args.save_delay_s)
                    hk.save_checkpoint(args.ckpt, model, optimizer, epoch=epoch, batch=batch)

                guard.save_and_exit(slow_save, epoch, batch + 1)
            marked = {"preemption": True} if args.background else {}     # not the periodic save of this step
            hk.save_checkpoint(args.ckpt, model, optimizer, epoch=epoch, batch=batch + 1, blocking=not args.background,
                               **marked)
            guard.exit()          # waits for rank 0's background write before any rank exits
    epoch, start_batch = epoch + 1, 0

write_result(args.out, ctx.rank, {"size": ctx.size, "steps": steps, "resumed_at": resumed_at,
                                  "params": [t.tolist() for t in model.parameters()]})
