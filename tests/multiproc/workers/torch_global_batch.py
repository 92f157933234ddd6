"""Worker: a fixed global batch (hk.global_batch_loader), float64, BatchNorm + Dropout + Adam (two groups).

Trains --steps optimizer steps in all (5 a epoch: 60 samples, global batch 12 in micro-batches of 2),
checkpointing into --ckpt (a directory) after every step. --preempt-at S: rank --victim sends itself
SIGTERM after step S; hk.PreemptionGuard then checkpoints on every rank and exits 75. --resume goes on
from the newest checkpoint on however many ranks this run has. Rank 0 writes the final parameters,
optimizer state and BatchNorm statistics to rank0.json (every rank writes its size and steps).
"""

import argparse
import os
import signal

import torch
import torch.nn.functional as F
from global_batch_setup import data, model_with_batchnorm
from rank_results import write_result
from torch.utils.data import TensorDataset

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--ckpt", required=True)
p.add_argument("--resume", action="store_true")
p.add_argument("--steps", type=int, default=15)
p.add_argument("--preempt-at", type=int, default=None, help="the step after which --victim gets SIGTERM")
p.add_argument("--victim", type=int, default=1)
p.add_argument("--shard", action="store_true", help="shard_optimizer_state=True")
p.add_argument("--micro-batch", type=int, default=2)
p.add_argument("--plain", action="store_true",
               help="one process, no hvdkit loader or optimizer: batches of 12 in the same order, one backward each "
                    "(with --mlp: the mean over the global batch that the mode must equal)")
p.add_argument("--mlp", action="store_true", help="no BatchNorm or Dropout, whose batches would differ in --plain")
p.add_argument("--clip", type=float, default=None, help="clip_grad_norm_ to this after each step's backward passes")
p.add_argument("--nan-at", type=int, default=None, help="rank 0's loss is NaN in step N (counted from 1)")
args = p.parse_args()

ctx = hk.init(seed=1, threads=1)
x, y = data(60)
loader = hk.global_batch_loader(TensorDataset(x, y), global_batch=12, micro_batch=args.micro_batch, seed=7,
                                num_workers=0)

model = model_with_batchnorm(mlp=args.mlp)
decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.dim() > 1)]
optimizer = torch.optim.Adam([{"params": decay, "weight_decay": 0.01}, {"params": rest}], lr=0.01)
if args.plain:
    for done in range(args.steps):
        epoch, step = divmod(done, 5)
        order = torch.randperm(60, generator=torch.Generator().manual_seed(7 + epoch))[12 * step:12 * step + 12]
        optimizer.zero_grad()
        F.cross_entropy(model(x[order]), y[order]).backward()
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
    write_result(args.out, 0, {"size": 1, "params": {n: t.tolist() for n, t in model.named_parameters()}})
    raise SystemExit(0)
optimizer = hk.DistributedOptimizer(optimizer, model, global_batch=loader, shard_optimizer_state=args.shard)
guard = hk.PreemptionGuard()

done = 0
if args.resume:
    extra = hk.load_checkpoint(os.path.join(args.ckpt, ""), model, optimizer)
    done = extra["done"]
else:
    hk.broadcast_state(model, optimizer)
resumed_at = done

per_epoch = loader.steps_per_epoch
while done < args.steps:
    loader.set_epoch(done // per_epoch, start_step=done % per_epoch)
    for step in loader:
        optimizer.zero_grad()
        for xb, yb in step:
            loss = F.cross_entropy(model(xb), yb)
            if args.nan_at == done + 1 and ctx.rank == 0:
                loss = loss * float("nan")
            loss.backward()
        if args.clip:       # the step's gradient on every rank, also on one that took no micro-batch
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            assert norm > args.clip, f"the clip at {args.clip} did nothing (norm {norm})"
        try:
            optimizer.step()
        except hk.NonFiniteGradientError as exc:
            write_result(args.out, ctx.rank, {"size": ctx.size, "error": str(exc)}, prefix="nonfinite")
            raise SystemExit(0) from None
        done += 1
        if args.preempt_at == done and ctx.rank == args.victim:
            os.kill(os.getpid(), signal.SIGTERM)
        if guard.requested():
            hk.save_checkpoint(os.path.join(args.ckpt, ""), model, optimizer, step=done, keep_last=2, done=done)
            write_result(args.out, ctx.rank, {"size": ctx.size, "done": done}, prefix="preempted")
            guard.exit()
        if done == args.steps:
            break

state = optimizer.state_dict()       # collective when sharded: every rank
write_result(args.out, ctx.rank, {
    "size": ctx.size, "resumed_at": resumed_at, "done": done,
    "params": {n: t.tolist() for n, t in model.named_parameters()},
    "buffers": {n: t.tolist() for n, t in model.named_buffers() if t.is_floating_point()},
    "optimizer": [{k: (v.tolist() if torch.is_tensor(v) else v) for k, v in s.items()}
                  for _, s in sorted(state["state"].items())],
})
