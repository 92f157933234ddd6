"""Worker: ranks start different; after broadcast_state all must be bitwise identical."""

import argparse

import torch
from rank_results import write_result
from torch_common import SmallNet, make_optimizer, optimizer_tensors, tensor_digest

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--optimizer", choices=["sgd", "adam"], required=True)
p.add_argument("--state", choices=["empty", "stepped"], required=True)
p.add_argument("--mismatch", action="store_true", help="rank 1's model has one more buffer")
p.add_argument("--forget-broadcast", action="store_true", help="train without broadcast_state (expect an error)")
args = p.parse_args()

ctx = hk.init(threads=1)
torch.manual_seed(100 + ctx.rank)                  # different weights on every rank
model = SmallNet()
if args.mismatch and ctx.rank == 1:
    model.register_buffer("extra", torch.zeros(3))
model.train()
model(torch.randn(8, 1, 8, 8) * (ctx.rank + 1))    # different BatchNorm running stats too
optimizer = make_optimizer(args.optimizer, model.parameters())
if args.state == "stepped":                        # a local (unwrapped) step: rank-specific state
    model(torch.randn(8, 1, 8, 8)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
optimizer.param_groups[0]["lr"] *= ctx.rank + 1   # even hyper-parameters differ
before = tensor_digest(model.state_dict().values())
optimizer = hk.DistributedOptimizer(optimizer, model)
if args.mismatch:
    try:
        hk.broadcast_state(model, optimizer)
        error = None
    except Exception as exc:  # noqa: BLE001 - the test reads the type and message
        error = f"{type(exc).__name__}: {exc}"
    write_result(args.out, ctx.rank, {"rank": ctx.rank, "size": ctx.size, "error": error})
    raise SystemExit(0)
if args.forget_broadcast:
    steps = 0
    try:
        for _ in range(2):
            model(torch.randn(8, 1, 8, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
        error = None
    except Exception as exc:  # noqa: BLE001 - the test reads the type and message
        error = f"{type(exc).__name__}: {exc}"
    write_result(args.out, ctx.rank, {"rank": ctx.rank, "size": ctx.size, "error": error, "steps": steps})
    raise SystemExit(0)
hk.broadcast_state(model, optimizer)
write_result(args.out, ctx.rank, {
    "rank": ctx.rank, "size": ctx.size,
    "before": before,
    "params": tensor_digest(model.parameters()),
    "buffers": tensor_digest(model.buffers()),
    "optimizer": tensor_digest(optimizer_tensors(optimizer)),
    "optimizer_state_len": len(optimizer.state_dict()["state"]),
    "lr": optimizer.param_groups[0]["lr"],
})
