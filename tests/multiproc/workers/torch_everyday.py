"""Worker: the everyday path's silent mistakes (issue 35), each a --case; rank results record warnings and errors.

    nan           rank 1's loss turns NaN at step 3: every rank must stop, naming rank 1, weights still finite
    unused        a parameter the forward never uses: the real "no gradient" warning names it
    plain_loader  DataLoader(shuffle=True) without sharding: one warning on rank 0 naming the fix
    sharded       hk.distributed_loader: no warning
    random_split  random_split after hk.init(seed), then distributed_loader: the same split on every rank
"""

import argparse
import logging
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from rank_results import write_result
from torch.utils.data import DataLoader, TensorDataset, random_split

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--case", required=True, choices=["nan", "unused", "plain_loader", "sharded", "random_split"])
args = p.parse_args()

warnings = []


class Record(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())


logging.getLogger("hvdkit.torch").addHandler(Record())
ctx = hk.init(seed=3, threads=1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 2)
        self.spare = nn.Linear(16, 2)          # in the model, never in forward: the "unused" case trains it

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(200, 6, generator=g), torch.randint(0, 2, (200,), generator=g))
result = {"rank": ctx.rank, "size": ctx.size, "error": None}
if args.case == "random_split":
    train, val = random_split(data, [150, 50])
    result["train_indices"] = list(train.indices)
    data = train
if args.case == "plain_loader":
    loader = DataLoader(data, batch_size=10, shuffle=True)
else:
    loader = hk.distributed_loader(data, batch_size=10, shuffle=True, seed=3)

model = Net()
params = model.parameters() if args.case == "unused" else list(model.fc1.parameters()) + list(model.fc2.parameters())
optimizer = hk.DistributedOptimizer(torch.optim.SGD(params, lr=0.1, momentum=0.9), model)
hk.broadcast_state(model, optimizer)
steps = 0
try:
    for epoch in range(2):
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            if args.case == "nan" and ctx.rank == 1 and steps == 2:
                loss = loss * math.nan                 # e.g. a log(0) on this rank's batch
            loss.backward()
            optimizer.step()
            steps += 1
except hk.UserError as exc:
    result["error"] = f"{type(exc).__name__}: {exc}"
result.update(steps=steps, warnings=warnings,
              finite=all(bool(torch.isfinite(q).all()) for q in model.parameters()))
write_result(args.out, ctx.rank, result)
