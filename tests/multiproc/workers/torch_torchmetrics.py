"""Worker: torchmetrics on N ranks with hk.torchmetrics_sync() against one process over the whole data (issue 54).

101 validation rows (no world size of 2 or 3 divides them) through hk.eval_loader, a fixed model (seeded alike on
every rank), and three kinds of state: sums (BinaryAccuracy), joined rows (BinaryAUROC without thresholds) and a
mean (MeanSquaredError). Each rank writes the synced results, the results of the same metrics without the sync
(each rank's own shard, what torchmetrics gives in a Horovod job), and rank 0 the whole set in this process alone.
"""

import argparse

import torch
import torchmetrics
from rank_results import write_result

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args = p.parse_args()
ctx = hk.init(seed=0, threads=1)

generator = torch.Generator().manual_seed(0)
x = torch.randn(101, 8, generator=generator)
y = (x @ torch.randn(8, generator=generator) + 0.5 * torch.randn(101, generator=generator) > 0).long()
model = torch.nn.Linear(8, 1)
model.load_state_dict({"weight": torch.randn(1, 8, generator=generator), "bias": torch.zeros(1)})


def metrics(**sync):
    return {"accuracy": torchmetrics.classification.BinaryAccuracy(**sync),
            "auroc": torchmetrics.classification.BinaryAUROC(**sync),
            "mse": torchmetrics.MeanSquaredError(**sync)}


def evaluate(named, loader):
    with torch.no_grad():
        for xb, yb in loader:
            scores = torch.sigmoid(model(xb).squeeze(1))
            for name, metric in named.items():
                metric.update(scores, yb.float() if name == "mse" else yb)
    return {name: float(metric.compute()) for name, metric in named.items()}


loader = hk.eval_loader(torch.utils.data.TensorDataset(x, y), batch_size=16)
result = {"size": ctx.size, "rows": len(loader.sampler), "synced": evaluate(metrics(**hk.torchmetrics_sync()), loader),
          "own_shard": evaluate(metrics(), loader)}
if ctx.rank == 0:
    whole = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    result["one_process"] = evaluate(metrics(), whole)
write_result(args.out, ctx.rank, result)
