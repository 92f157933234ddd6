"""Worker: hk.DistributedOptimizer(shard_optimizer_state=True) against the same job unsharded (issue 39).

The data is one global batch of 12 rows per micro-batch, cut into equal slices per rank, so the averaged
gradient is the same on 1, 2, 3 or 4 ranks and a checkpoint can be compared across world sizes.

--phase compare: from one start, --steps steps of each (float64, 2 micro-batches a step with
  backward_passes_per_step=2, clip_grad_norm_ between backward and step); the largest difference in the
  parameters and in the consolidated optimizer state, and the state bytes each rank holds.
--phase save: 5 steps sharded, save_checkpoint, 5 more; the final parameters.
--phase resume: load the checkpoint (sharded with --shard), 5 steps; the final parameters.
--phase refusals: what sharding cannot do, each a UserError: LBFGS, Adasum, step(closure), add_param_group,
  a sparse gradient, a parameter given new memory after wrapping, and state loaded on rank 0
  alone (which used to leave rank 0 alone in the gathering allgather: a hang).
"""

import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from rank_results import write_result

import hvdkit.torch as hk
import hvdkit.torch.sharded as sharded_state

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="adam")
p.add_argument("--phase", choices=["compare", "save", "resume", "refusals", "save-on-main", "last-save-on-main"],
               default="compare")
p.add_argument("--ckpt")
p.add_argument("--shard", action="store_true", help="resume into a sharded optimizer")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--amp", action="store_true", help="float32 with a GradScaler: unscale_, clip, scaler.step")
args = p.parse_args()

ctx = hk.init(threads=1)
torch.set_default_dtype(torch.float32 if args.amp else torch.float64)
torch.manual_seed(0)
G, K, CLIP = 12, 2, 0.5
data = torch.randn(40, K, G, 10), torch.randint(0, 3, (40, K, G))


class Net(nn.Module):
    """Two layers, a one-element temperature (ranks past the first get an empty slice) and a 0-dim offset."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(10, 32), nn.Linear(32, 3)
        self.temperature = nn.Parameter(torch.ones(1))
        self.offset = nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x))) * self.temperature + self.offset


def make(model, shard):
    if args.optimizer == "sgd":
        inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    elif args.optimizer == "adamw":
        inner = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=1e-2)
    else:
        inner = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=1e-4)
    opt = hk.DistributedOptimizer(inner, model, backward_passes_per_step=K, shard_optimizer_state=shard)
    hk.broadcast_state(model, opt)
    return opt


def train(model, opt, steps, first=0):
    rows = slice(ctx.rank * G // ctx.size, (ctx.rank + 1) * G // ctx.size)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if args.amp else None
    for step in range(first, first + steps):
        for micro in range(K):
            x, y = data[0][step, micro, rows], data[1][step, micro, rows]
            loss = F.cross_entropy(model(x), y)
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)     # sees the averaged gradients
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad()


def params(model):
    return torch.cat([q.detach().reshape(-1) for q in model.parameters()])


def state_bytes(opt):
    shards = sharded_state.slices_of(opt)
    if shards is not None:
        return shards.state_bytes()
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))


result = {"rank": ctx.rank, "size": ctx.size}


def recording_error(call, *call_args, **kwargs):
    """``call(...)``; if it raises, this rank's result records the error (as "Type: message") before it goes on."""
    try:
        return call(*call_args, **kwargs)
    except Exception as exc:
        write_result(args.out, ctx.rank, {**result, "error": f"{type(exc).__name__}: {exc}"})
        raise


if args.phase == "compare":
    plain_model = Net()
    sharded_model = copy.deepcopy(plain_model)
    initial = params(plain_model)
    plain, sharded = make(plain_model, False), make(sharded_model, True)
    train(plain_model, plain, args.steps)
    train(sharded_model, sharded, args.steps)
    a, b = plain.state_dict(), sharded.state_dict()          # collective for the sharded one
    # Gathered on one rank only (what a checkpoint's save does): the last rank, to see the root is not fixed.
    on_root = sharded_state.gathered_state(sharded, ctx.size - 1)
    if ctx.rank == ctx.size - 1:
        result["root_gather_equal"] = all(torch.equal(torch.as_tensor(v), torch.as_tensor(on_root["state"][i][k]))
                                          for i, s in b["state"].items() for k, v in s.items())
    else:
        result["root_gather_equal"] = on_root is None
    state_diff = max(float((torch.as_tensor(a["state"][i][k]) - torch.as_tensor(v)).abs().max())
                     for i, s in b["state"].items() for k, v in s.items())
    result.update(param_diff=float((params(plain_model) - params(sharded_model)).abs().max()),
                  moved=float((params(sharded_model) - initial).abs().max()),
                  state_diff=state_diff, same_keys=sorted(a["state"]) == sorted(b["state"]) and all(
                      sorted(a["state"][i]) == sorted(b["state"][i]) for i in a["state"]),
                  plain_bytes=state_bytes(plain), sharded_bytes=state_bytes(sharded),
                  plain_state_empty=len(sharded.state) == 0)
elif args.phase == "save":
    model = Net()
    opt = make(model, True)
    train(model, opt, 5)
    hk.save_checkpoint(args.ckpt, model, opt, epoch=0)
    train(model, opt, 5, first=5)
    result["params"] = params(model).tolist()
elif args.phase == "save-on-main":           # a user's mistake: the save under `if ctx.is_main:`, mid-training
    model = Net()
    opt = make(model, True)
    train(model, opt, 2)
    if ctx.is_main:
        recording_error(hk.save_checkpoint, args.ckpt, model, opt)
    recording_error(train, model, opt, 2, first=2)
elif args.phase == "last-save-on-main":      # the DDP habit: the final save under `if ctx.is_main:`, then exit
    model = Net()
    opt = make(model, True)
    train(model, opt, 2)
    result["error"] = None
    if ctx.is_main:
        recording_error(hk.save_checkpoint, args.ckpt, model, opt)
elif args.phase == "refusals":
    model = Net()
    cases = {
        "lbfgs": lambda: hk.DistributedOptimizer(torch.optim.LBFGS(model.parameters()), model,
                                                 shard_optimizer_state=True),
        "adasum": lambda: hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, op="adasum",
                                                  shard_optimizer_state=True),
    }
    opt = make(model, True)
    cases["closure"] = lambda: opt.step(lambda: 0.0)
    cases["add_param_group"] = lambda: opt.add_param_group({"params": [nn.Parameter(torch.ones(2))]})

    def sparse():
        emb = nn.Embedding(20, 4, sparse=True)
        sparse_opt = hk.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1), emb,
                                             shard_optimizer_state=True)
        emb(torch.tensor([1, 2])).sum().backward()
        sparse_opt.step()

    def replaced():
        other = Net()
        other_opt = make(other, True)
        other.fc1.weight.data = other.fc1.weight.data.clone()          # new memory, as model.half() would give
        train(other, other_opt, 1)

    def loaded_on_rank_0_only():
        other = Net()
        other_opt = make(other, True)
        train(other, other_opt, 1)
        if ctx.rank == 0:
            other_opt.load_state_dict({"state": {}, "param_groups": other_opt.state_dict()["param_groups"]})
        else:
            other_opt.state_dict()          # rank 0's state_dict() gathers here as well
        other_opt.state_dict()

    def rolled_back_on_rank_0_only():
        # Horovod's resume recipe mid-training: rank 0 loads an earlier state, broadcast_state sends it. Each rank
        # holds state already, so the gather found the same entries and mixed rank 0's new slice with the
        # others' old ones, silently (found by trying it as a user).
        other = Net()
        other_opt = make(other, True)
        train(other, other_opt, 1)
        earlier = other_opt.state_dict()
        train(other, other_opt, 1, first=1)
        if ctx.rank == 0:
            other_opt.load_state_dict(earlier)
        hk.broadcast_state(other, other_opt)

    cases.update(sparse=sparse, replaced=replaced, rank0_load=loaded_on_rank_0_only,
                 rank0_rollback=rolled_back_on_rank_0_only)
    errors = {}
    for name, call in cases.items():
        try:
            call()
            errors[name] = None
        except hk.UserError as exc:
            errors[name] = str(exc)
    result["errors"] = errors
else:
    model = Net()
    opt = make(model, args.shard)
    hk.load_checkpoint(args.ckpt, model, opt)
    train(model, opt, 5, first=5)
    result["params"] = params(model).tolist()
    result["sharded"] = sharded_state.slices_of(opt) is not None
write_result(args.out, ctx.rank, result)
