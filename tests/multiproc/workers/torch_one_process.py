"""Worker (1 rank): a port against its original on one process, with dropout drawing from torch's global generator.

Trains the same seeded model four ways and writes each run's weight digest: the original's DataLoader and the
port's hk.distributed_loader, without shuffling and with it, the port's loader as shipped (its own generator)
and with generator=None.
"""

import argparse

import torch
import torch.nn.functional as F
from rank_results import write_result
from torch.utils.data import DataLoader, TensorDataset
from torch_common import tensor_digest

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args = p.parse_args()
ctx = hk.init(seed=0, threads=1)
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g))


def train(make_loader, port: bool) -> str:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if port:
        optimizer = hk.DistributedOptimizer(optimizer, model)
        hk.broadcast_state(model, optimizer)
    loader = make_loader()
    for epoch in range(2):
        if port:
            loader.sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    return tensor_digest(model.state_dict().values())


runs = {
    "original": train(lambda: DataLoader(data, batch_size=16), port=False),
    "port_generator_none": train(lambda: hk.distributed_loader(data, 16, shuffle=False, generator=None), port=True),
    "port_as_shipped": train(lambda: hk.distributed_loader(data, 16, shuffle=False), port=True),
    "original_shuffled": train(lambda: DataLoader(data, batch_size=16, shuffle=True), port=False),
    "port_shuffled": train(lambda: hk.distributed_loader(data, 16, generator=None), port=True),
}
write_result(args.out, ctx.rank, {"size": ctx.size, **runs})
