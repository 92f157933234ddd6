"""Worker: an elastic job that loses a worker while rank 0's background save is in flight (issue 53).

A commit every step. At step --save-at every rank calls save_checkpoint(blocking=False); rank 0's write first
waits --slow-s (a slow file system), rank 0 writes the file ``in_flight`` in --out once the call has returned,
and every rank then waits --hold-s, so that the test can kill the other worker (and make the checkpoint's
directory read-only) while the write is under way. Each rank writes its pid to ``pid<rank>``. Each start of
``train`` (the job's, each reset's) prints "start size N step S written W" on rank 0, W saying whether the
checkpoint's file exists. A CheckpointError ends the job with its line, after "raised in:" and the functions
its traceback went through; otherwise the job trains --steps steps, saves once more (blocking) and prints
"done steps N".
"""

import argparse
import os
import time
import traceback

import torch
from torch.utils.data import TensorDataset

import hvdkit.runtime.checkpoint as core
import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--ckpt", required=True)
p.add_argument("--steps", type=int, default=60)
p.add_argument("--save-at", type=int, default=10)
p.add_argument("--slow-s", type=float, default=6.0)
p.add_argument("--step-seconds", type=float, default=0.05)
p.add_argument("--hold-s", type=float, default=3.0, help="every rank waits this long after the save's call")
args = p.parse_args()


def slow_save_to(*a, _save_to=core.save_to, **kw):
    time.sleep(args.slow_s)
    return _save_to(*a, **kw)


core.save_to = slow_save_to
ctx = hk.init(seed=1, threads=1)
with open(os.path.join(args.out, f"pid{ctx.rank}"), "w") as f:
    f.write(str(os.getpid()))
g = torch.Generator().manual_seed(0)
x = torch.randn(4000, 6, generator=g)
y = x @ torch.randn(6, 1, generator=g)
loader = hk.elastic.elastic_loader(TensorDataset(x, y), batch_size=4, seed=3)
model = torch.nn.Sequential(torch.nn.Linear(6, 33), torch.nn.Tanh(), torch.nn.Linear(33, 1))
optimizer = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=hk.scale_lr(0.01)), model)
state = hk.elastic.ElasticState(model, optimizer, sampler=loader.sampler, base_lr=0.01)
state.register_commit_callbacks([lambda s: hk.current().is_main and print(
    f"committed step {s.step} epoch {s.epoch} size {hk.current().size}", flush=True)])


@hk.elastic.run
def train(state):
    if hk.current().is_main:
        print(f"start size {hk.current().size} step {state.step} written {os.path.exists(args.ckpt)}", flush=True)
    while state.step < args.steps:
        for xb, yb in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            optimizer.step()
            time.sleep(args.step_seconds)
            state.step_done(len(xb))
            if state.step == args.save_at:
                hk.save_checkpoint(args.ckpt, model, optimizer, blocking=False, step=state.step)
                if hk.current().is_main:
                    open(os.path.join(args.out, "in_flight"), "w").close()
                time.sleep(args.hold_s)          # the test's kill lands here, with the write under way
            if state.step >= args.steps:
                break
        else:
            state.epoch_done()


try:
    train(state)
    hk.save_checkpoint(args.ckpt + ".end", model, optimizer, step=state.step)
except hk.CheckpointError as exc:
    print("raised in: " + " ".join(frame.name for frame in traceback.extract_tb(exc.__traceback__)), flush=True)
    raise SystemExit(f"error: {exc}") from None
if ctx.is_main:
    print(f"done steps {state.step}", flush=True)
