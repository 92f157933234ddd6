"""Worker: a checkpoint taken mid-epoch on one world size, resumed on another (issue 34, case 3).

--phase first: train K batches of epoch 0, save (epoch, the sampler's global position, the scheduler), stop.
--phase resume: load on however many ranks this job has, finish epoch 0 from that position.
Each rank writes the sample ids it trained on and, after loading, its learning rates.
"""

import argparse

import torch
import torch.nn.functional as F
from rank_results import write_result
from torch.utils.data import TensorDataset

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--ckpt", required=True)
p.add_argument("--phase", choices=["first", "resume"], required=True)
p.add_argument("--stop-after", type=int, default=14, help="batches of epoch 0 before the checkpoint")
p.add_argument("--scheduler", choices=["warmup", "sequential"], default="warmup",
               help="hvdkit's warmup alone, or warmup then cosine in a SequentialLR (schedulers of its own)")
args = p.parse_args()

ctx = hk.init(seed=1, threads=1)
g = torch.Generator().manual_seed(0)
N, B, BASE_LR = 400, 10, 0.1
data = TensorDataset(torch.randn(N, 4, generator=g), torch.randn(N, 1, generator=g), torch.arange(N))
loader = hk.distributed_loader(data, batch_size=B, shuffle=True, seed=3)
model = torch.nn.Linear(4, 1)
optimizer = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=hk.scale_lr(BASE_LR), momentum=0.9),
                                    model)
scheduler = hk.warmup_scheduler(optimizer, warmup_steps=5)
if args.scheduler == "sequential":
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=40)
    scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [scheduler, cosine], milestones=[5])
result = {"size": ctx.size, "rank": ctx.rank}
if args.phase == "resume":
    extra = hk.load_checkpoint(args.ckpt, model, optimizer, scheduler=scheduler)
    loader.sampler.set_epoch(extra["epoch"], start_sample=extra["samples"])
    inner = getattr(scheduler, "_schedulers", [])
    result.update(lr=[group["lr"] for group in optimizer.param_groups],
                  base_lrs=[s.base_lrs for s in inner] or [scheduler.base_lrs], start_sample=extra["samples"])
else:
    hk.broadcast_state(model, optimizer)
    loader.sampler.set_epoch(0)

seen = []
for batch, (x, y, ids) in enumerate(loader):
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    optimizer.step()
    scheduler.step()
    seen += ids.tolist()
    if args.phase == "first" and batch + 1 == args.stop_after:
        hk.save_checkpoint(args.ckpt, model, optimizer, scheduler=scheduler, epoch=0,
                           samples=loader.sampler.position(batch + 1))
        break
write_result(args.out, ctx.rank, {**result, "seen": seen})
