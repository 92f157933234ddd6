"""Worker: train for some epochs with checkpoint/resume; write the final parameters.

--mode straight: train epochs [0, E) in one run.
--mode first:    train epoch 0, save, exit.  --mode resume: load, train [1, E).
"""

import argparse
import os

import numpy as np
import torch
import torch.nn.functional as F
from rank_results import write_result
from torch.utils.data import TensorDataset
from torch_common import SmallNet, make_optimizer

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--mode", choices=["straight", "first", "resume"], required=True)
p.add_argument("--ckpt", required=True)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--optimizer", default="adam")
args = p.parse_args()

ctx = hk.init(seed=1, threads=1)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(96, 1, 8, 8, generator=g), torch.randint(0, 10, (96,), generator=g))
loader = hk.distributed_loader(data, batch_size=8, shuffle=True, seed=3)
torch.manual_seed(0)
model = SmallNet()
opt = hk.DistributedOptimizer(make_optimizer(args.optimizer, model.parameters()), model)
start = 0
if args.mode == "resume":
    start = hk.load_checkpoint(args.ckpt, model, opt)["epoch"] + 1
else:
    hk.broadcast_state(model, opt)
end = 1 if args.mode == "first" else args.epochs
for epoch in range(start, end):
    loader.sampler.set_epoch(epoch)
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    if args.ckpt.endswith("/"):                     # a checkpoint directory keeping the newest 2
        wrote = hk.save_checkpoint(args.ckpt, model, opt, step=epoch, keep_last=2, epoch=epoch)
    else:
        wrote = hk.save_checkpoint(args.ckpt, model, opt, epoch=epoch)
if start == end:
    wrote = False
final = {k: v.numpy() for k, v in model.state_dict().items()}
ckpt_dir = os.path.dirname(os.path.abspath(args.ckpt))
np.savez(os.path.join(args.out, f"{args.mode}-rank{ctx.rank}.npz"), **final)
write_result(args.out, ctx.rank, {"rank": ctx.rank, "size": ctx.size, "wrote": wrote, "start": start,
                                  "files": sorted(os.listdir(ckpt_dir)) if os.path.isdir(ckpt_dir) else []})
