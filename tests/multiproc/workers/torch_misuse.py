"""Worker: each wrong use must raise an error that names the fix."""

import argparse

import torch
import torch.nn as nn
from rank_results import write_result

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args = p.parse_args()

errors = {}


def capture(name, fn):
    try:
        fn()
        errors[name] = None
    except Exception as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"


model = nn.Linear(3, 3)
capture("before_init", lambda: hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model))
ctx = hk.init(threads=1)
other = nn.Linear(3, 3)
capture("optimizer_of_other_model", lambda: hk.DistributedOptimizer(torch.optim.SGD(other.parameters(), lr=0.1), model))
wrapped = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
capture("wrapped_twice", lambda: hk.DistributedOptimizer(wrapped, model))
capture("model_not_second", lambda: hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), 0.1))
meta = nn.Linear(3, 3, device="meta")
capture("model_on_other_device", lambda: hk.DistributedOptimizer(torch.optim.SGD(meta.parameters(), lr=0.1), meta))
capture("missing_checkpoint", lambda: hk.load_checkpoint(args.out + "/nope.pt", model))
with open(args.out + "/corrupt.pt", "wb") as f:
    f.write(b"not a checkpoint")
capture("corrupt_checkpoint", lambda: hk.load_checkpoint(args.out + "/corrupt.pt", model))
hk.save_checkpoint(args.out + "/linear3.pt", model)
capture("other_architecture", lambda: hk.load_checkpoint(args.out + "/linear3.pt", nn.Linear(3, 4)))
# Not an error case: state the optimizer already has (here a momentum buffer) survives the wrapping,
# which Horovod's own wrapper drops when it rebuilds the optimizer from param_groups.
stateful = nn.Linear(3, 3)
plain = torch.optim.SGD(stateful.parameters(), lr=0.1, momentum=0.9)
stateful(torch.ones(2, 3)).sum().backward()
plain.step()
before = {k: v["momentum_buffer"].clone() for k, v in plain.state_dict()["state"].items()}
after = hk.DistributedOptimizer(plain, stateful).state_dict()["state"]
state_kept = len(before) == 2 and sorted(after) == sorted(before) and all(
    torch.equal(before[k], after[k]["momentum_buffer"]) for k in before)
write_result(args.out, ctx.rank, {"rank": ctx.rank, "size": ctx.size, "errors": errors, "state_kept": state_kept})
