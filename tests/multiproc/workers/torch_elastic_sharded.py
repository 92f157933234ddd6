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
import signal
import time

import torch
from torch.utils.data import TensorDataset

import hvdkit.torch as hk
import hvdkit.torch.sharded as sharded
from hvdkit.backends.torch import hvd

p = argparse.ArgumentParser()
p.add_argument("--stop", required=True)
p.add_argument("--step-seconds", type=float, default=0.05)
p.add_argument("--plain", action="store_true", help="Horovod's unsharded optimizer state (a full copy per rank)")
p.add_argument("--backward-passes", type=int, default=1, help="backward_passes_per_step (gradient accumulation)")
p.add_argument("--scaler", action="store_true",
               help="a GradScaler whose scale doubles every step (AMP's recipe), given to the elastic state; each "
                    "commit then reports whether every rank holds the same weights and scale")
p.add_argument("--die-before-backward", type=int, default=None, metavar="STEP",
               help="rank 1 of 2 kills itself (SIGKILL) before the last backward pass of a step once STEP steps are "
                    "committed, so that rank 0 is waiting in that pass's allreduces when the job loses it")
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
                                    shard_optimizer_state=not args.plain, backward_passes_per_step=args.backward_passes)
scaler = torch.amp.GradScaler("cpu", init_scale=16.0, growth_interval=1) if args.scaler else None
state = hk.elastic.ElasticState(model, optimizer, sampler=loader.sampler, base_lr=0.001,
                                **({"scaler": scaler} if scaler else {}))


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
    agree = ""
    if scaler is not None:
        weights = hashlib.sha256(b"".join(q.detach().numpy().tobytes() for q in model.parameters())).hexdigest()
        seen = hvd.allgather_object((weights, scaler.get_scale()), name="agree")
        agree = f" ranks_agree {len(set(seen)) == 1} scale {scaler.get_scale()}"
    if hk.current().is_main:
        print(f"committed step {s.step} epoch {s.epoch} size {hk.current().size} digest {gathered}{agree}",
              flush=True)


state.register_commit_callbacks([log_commit])


@hk.elastic.run
def train(state):
    committed = state._handlers["optimizer"]._saved_optimizer_state
    now = optimizer.state_dict()                     # collective: every rank's new slices, gathered
    a, b = flat(now), flat(committed)
    diff = float((a - b).abs().max()) if a.numel() == b.numel() and a.numel() else (0.0 if a.numel() == b.numel()
                                                                                      else float("inf"))
    inner = sharded.slices_of(optimizer).inner if not args.plain else optimizer
    layout = sharded.slices_of(optimizer).size if not args.plain else hk.current().size
    mine = sum(v.numel() for s in inner.state.values() for v in s.values() if torch.is_tensor(v) and v.dim())
    fraction = mine / max(a.numel(), 1)
    # A gradient left from a step the reset dropped would be added into the next one (an accumulating loop
    # calls zero_grad() only after step()).
    stale = sum(float(q.grad.abs().sum()) for q in model.parameters() if q.grad is not None)
    diffs = hvd.allgather_object((diff, fraction, layout, optimizer.param_groups[0]["lr"], stale))
    if hk.current().is_main:
        sizes = sorted({s for _, _, s, _, _ in diffs})
        print(f"start size {hk.current().size} step {state.step} state_diff {max(d for d, *_ in diffs)} "
              f"slice_fraction {max(f for _, f, *_ in diffs):.3f} layout_sizes {sizes} "
              f"groups_lr {[lr for *_, lr, _ in diffs]} stale_grad {max(g for *_, g in diffs)} digest {digest(now)}",
              flush=True)
    while True:
        for i, (xb, yb) in enumerate(loader):
            last_pass = i % args.backward_passes == args.backward_passes - 1
            if state.step == args.die_before_backward and last_pass and hk.current().rank == 1 and \
                    hk.current().size == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            if i % args.backward_passes == 0:
                optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            (scaler.scale(loss) if scaler else loss).backward()
            if not last_pass:
                continue
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            time.sleep(args.step_seconds)
            if hvd.broadcast_object(os.path.exists(args.stop), name="stop"):
                return
            state.step_done(len(xb) * args.backward_passes)
        state.epoch_done()


train(state)
if hk.current().is_main:
    print(f"done steps {state.step} size {hk.current().size}", flush=True)
