"""Worker: ranks that run different numbers of steps, and a rank that is merely slow.

--case keras-shard   hk.shard_arrays, then model.fit, for each --rows/--batch pair: every rank must run the same
                     number of steps (one process for several pairs: TensorFlow starts once)
--case torch-extra   rank 0 trains one batch more than the others, then all evaluate: a deadlock that the
                     patched Horovod must end with the ranks named (HOROVOD_STALL_CHECK_TIME_SECONDS short)
--case torch-slow    rank 0 spends --sleep seconds outside any collective (a long evaluation) while the
                     others wait in the next allreduce: that is not a deadlock and must finish
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--case", choices=["keras-shard", "torch-extra", "torch-slow"], required=True)
p.add_argument("--rows", type=int, nargs="+", default=[1025])
p.add_argument("--batch", type=int, nargs="+", default=[32])
p.add_argument("--sleep", type=float, default=8.0)
args = p.parse_args()

if args.case == "keras-shard":
    import numpy as np
    from rank_results import write_result

    import hvdkit.keras as hk

    keras = hk.use_backend("tensorflow")
    ctx = hk.init(seed=0)

    class CountBatches(keras.callbacks.Callback):
        batches = 0

        def on_train_batch_end(self, batch, logs=None):
            CountBatches.batches += 1

    runs = []
    for rows, batch in zip(args.rows, args.batch):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(rows, 8)).astype("float32")
        y = (x.sum(axis=1) > 0).astype("int64")
        x, y = hk.shard_arrays(x, y)
        CountBatches.batches = 0
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=batch, epochs=2, verbose=0, shuffle=True,
                  callbacks=[*hk.callbacks(), CountBatches()])
        runs.append({"rows": len(x), "batches": CountBatches.batches})
    write_result(args.out, ctx.rank, {"size": ctx.size, "runs": runs})
    sys.exit(0)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from rank_results import write_result  # noqa: E402
from torch_common import SmallNet  # noqa: E402

import hvdkit.torch as hk  # noqa: E402

ctx = hk.init(seed=0, threads=1)
model = SmallNet()
optimizer = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
hk.broadcast_state(model, optimizer)
x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))


def train_step():
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()


steps = 5 + (1 if args.case == "torch-extra" and ctx.rank == 0 else 0)
start = time.time()
try:
    for i in range(steps):
        train_step()
        if args.case == "torch-slow" and ctx.rank == 0 and i == 2:
            time.sleep(args.sleep)            # "a long evaluation on rank 0" between two steps
    accuracy = hk.metric_average(1.0, "accuracy")
except Exception as exc:                      # the deadlock ends as an exception on every rank
    write_result(args.out, ctx.rank, {"size": ctx.size, "error": f"{type(exc).__name__}: {exc}",
                                      "seconds": time.time() - start})
    raise
write_result(args.out, ctx.rank, {"size": ctx.size, "steps": steps, "seconds": time.time() - start})
