"""Worker: an elastic job with shard_optimizer_state=True (issue 39) that checks every reset lost no state.

Adam in float64 on a small regression, a commit every step. Each time ``train`` starts (the job's start, and
after every reset: a graceful shrink, a worker joining, a killed worker), every rank gathers the sharded state
(``optimizer.state_dict()``, cut for the new rank and size) and compares it with the handler's copy of the last
commit, element by element; rank 0 prints one line per start, with a digest of the state gathered (step counts
included):

    start size 2 step 14 state_diff 0.0 slice_fraction 0.500 layout_sizes [2] groups_lr [0.002, 0.002] digest 5d1f..

and "committed step N epoch E size S digest D" per commit, D gathered the same way by the worker itself, apart
from the handler's copy (tests/elastic_job.py reads those; the test matches each start's digest with its commit's).
It trains until the file --stop exists (every rank agrees through one broadcast a step), then prints "done steps N".
"""

import argparse
import hashlib
import os
import time

import torch
from torch.utils.data import TensorDataset

import hvdkit.torch as hk
from hvdkit.backends.torch import hvd

p = argparse.ArgumentParser()
p.add_argument("--stop", required=True)
p.add_argument("--step-seconds", type=float, default=0.05)
args = p.parse_args()

ctx = hk.init(seed=1, threads=1)
torch.set_default_dtype(torch.float64)
g = torch.Generator().manual_seed(0)
x = torch.randn(4000, 6, generator=g)
y = x @ torch.randn(6, 1, generator=g)
loader = hk.elastic.elastic_loader(TensorDataset(x, y), batch_size=4, seed=3)
torch.manual_seed(5)
model = torch.nn.Sequential(torch.nn.Linear(6, 33), torch.nn.Tanh(), torch.nn.Linear(33, 1))
optimizer = hk.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=hk.scale_lr(0.001)), model,
                                    shard_optimizer_state=True)
state = hk.elastic.ElasticState(model, optimizer, sampler=loader.sampler, base_lr=0.001)


def digest(opt_state: dict) -> str:
    h = hashlib.sha256()
    for i, entry in sorted(opt_state["state"].items()):
        for key, value in sorted(entry.items()):
            h.update(f"{i}.{key}".encode())
            h.update(torch.as_tensor(value).double().numpy().tobytes())
    return h.hexdigest()[:16]


def flat(opt_state: dict) -> torch.Tensor:
    return torch.cat([v.reshape(-1).double() for _, entry in sorted(opt_state["state"].items())
                      for _, v in sorted(entry.items()) if torch.is_tensor(v)] or [torch.zeros(0)])


def log_commit(s):
    gathered = digest(optimizer.state_dict())        # collective: every rank commits at the same step
    if hk.current().is_main:
        print(f"committed step {s.step} epoch {s.epoch} size {hk.current().size} digest {gathered}", flush=True)


state.register_commit_callbacks([log_commit])


@hk.elastic.run
def train(state):
    committed = state._handlers["optimizer"]._saved_optimizer_state
    now = optimizer.state_dict()                     # collective: every rank's new slices, gathered
    a, b = flat(now), flat(committed)
    diff = float((a - b).abs().max()) if a.numel() == b.numel() and a.numel() else (0.0 if a.numel() == b.numel()
                                                                                      else float("inf"))
    shards = optimizer._hvdkit_shards
    mine = sum(v.numel() for s in shards.inner.state.values() for v in s.values() if torch.is_tensor(v) and v.dim())
    fraction = mine / max(a.numel(), 1)
    diffs = hvd.allgather_object((diff, fraction, shards.size, optimizer.param_groups[0]["lr"]))
    if hk.current().is_main:
        print(f"start size {hk.current().size} step {state.step} state_diff {max(d for d, *_ in diffs)} "
              f"slice_fraction {max(f for _, f, *_ in diffs):.3f} layout_sizes {sorted({s for *_, s, _ in diffs})} "
              f"groups_lr {[lr for *_, lr in diffs]} digest {digest(now)}", flush=True)
    while True:
        for xb, yb in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            optimizer.step()
            time.sleep(args.step_seconds)
            if hvd.broadcast_object(os.path.exists(args.stop), name="stop"):
                return
            state.step_done(len(xb))
        state.epoch_done()


train(state)
if hk.current().is_main:
    print(f"done steps {state.step} size {hk.current().size}", flush=True)
