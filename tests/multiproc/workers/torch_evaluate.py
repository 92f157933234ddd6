"""Worker: distributed evaluation over an odd-sized test set equals the single-process pass."""

import argparse

import torch
import torch.nn.functional as F
from rank_results import write_result
from torch.utils.data import DataLoader, TensorDataset
from torch_common import SmallNet

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args = p.parse_args()

ctx = hk.init(threads=1)
g = torch.Generator().manual_seed(0)
test = TensorDataset(torch.randn(359, 1, 8, 8, generator=g), torch.randint(0, 10, (359,), generator=g))
torch.manual_seed(0)
model = SmallNet()
hk.broadcast_state(model)
model.eval()
metrics = hk.evaluate(model, hk.eval_loader(test, batch_size=50))
# A plain average of per-rank accuracies (what hand-written code often does).
with torch.no_grad():
    shard = [test[i] for i in hk.ShardSampler(len(test), ctx.rank, ctx.size)]
    xs = torch.stack([s[0] for s in shard])
    ys = torch.stack([s[1] for s in shard])
    local_acc = (model(xs).argmax(1) == ys).float().mean().item()
averaged = hk.metric_average(local_acc, "acc")
result = {"rank": ctx.rank, "size": ctx.size, "metrics": metrics, "metric_average": averaged}
if ctx.rank == 0:
    with torch.no_grad():
        correct = total = loss = 0.0
        for x, y in DataLoader(test, batch_size=359):
            out = model(x)
            correct += (out.argmax(1) == y).sum().item()
            loss += F.cross_entropy(out, y, reduction="sum").item()
            total += len(y)
    result["single"] = {"accuracy": correct / total, "loss": loss / total, "count": int(total)}
write_result(args.out, ctx.rank, result)
