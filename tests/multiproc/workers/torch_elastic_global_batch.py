"""Worker: an elastic job with a fixed global batch (hk.global_batch_loader as the ElasticState's sampler).

float64, BatchNorm + Dropout + Adam with sharded state, 240 samples in steps of 12 (micro-batches of 2: 20 steps
an epoch), a commit every step, --steps steps in all. --kill-at S: rank 1 of 2 kills itself (SIGKILL) before the
backward pass of its last micro-batch of step S, so rank 0 waits in that step's sum when the job loses it; the
survivor restores the last commit and goes on alone. Rank 0 writes the final parameters and optimizer state to
--out and prints "done steps N size M".
"""

import argparse
import json
import os
import signal
import time

import torch
import torch.nn.functional as F
from global_batch_setup import data, model_with_batchnorm
from torch.utils.data import TensorDataset

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--kill-at", type=int, default=None)
p.add_argument("--kill-after", action="store_true",
               help="--kill-at's rank dies after the step's optimizer.step(), before its commit: the survivor's "
                    "model and loader both go back to the commit before")
p.add_argument("--step-seconds", type=float, default=0.05)
args = p.parse_args()

ctx = hk.init(seed=1, threads=1)
x, y = data(240)
loader = hk.global_batch_loader(TensorDataset(x, y), global_batch=12, micro_batch=2, seed=7, num_workers=0)
model = model_with_batchnorm()
optimizer = hk.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), model, global_batch=loader,
                                    shard_optimizer_state=True)
state = hk.elastic.ElasticState(model, optimizer, sampler=loader)


def lost() -> bool:
    return hk.current().rank == 1 and hk.current().size == 2


@hk.elastic.run
def train(state):
    while state.step < args.steps:
        for step in loader:
            optimizer.zero_grad()
            for i, (xb, yb) in enumerate(step):
                if state.step == args.kill_at and i == len(step) - 1 and not args.kill_after and lost():
                    os.kill(os.getpid(), signal.SIGKILL)
                F.cross_entropy(model(xb), yb).backward()
            optimizer.step()
            if state.step == args.kill_at and args.kill_after and lost():
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(args.step_seconds)
            state.step_done(step.samples)
            if state.step == args.steps:
                return
        state.epoch_done()


train(state)
opt_state = optimizer.state_dict()          # collective when sharded
if hk.current().is_main:
    with open(args.out, "w") as f:
        json.dump({"size": hk.current().size, "step": state.step, "epoch": state.epoch,
                   "params": [t.tolist() for t in model.parameters()],
                   "optimizer": [{k: v.tolist() for k, v in s.items()} for _, s in sorted(opt_state["state"].items())]},
                  f)
    print(f"done steps {state.step} size {hk.current().size}", flush=True)
