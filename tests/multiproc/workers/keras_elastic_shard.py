"""Worker: ElasticState.shard and its commit callback at an epoch's end (what a reset can resume into)."""

import argparse

import numpy as np
from keras_common import parse_args
from rank_results import write_result

import hvdkit.keras as hk

args = parse_args(argparse.ArgumentParser())

keras = hk.use_backend(args.mode)   # before init, which reads the backend
ctx = hk.init(threads=1)
N, BATCH = 37, 8
x = np.zeros((N, 4), "float32")
x[:, 0] = np.arange(N)                                  # column 0 names the sample
y = (np.arange(N) % 2).astype("int64")
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])   # never fit before the tiny shard
opt = hk.DistributedOptimizer(keras.optimizers.SGD(0.01))
model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
state = hk.elastic.ElasticState(model, opt, seed=3)
commits = []
state.register_commit_callbacks([lambda s: commits.append((s.epoch, s.step, s.consumed))])


def fit(xs, ys):
    model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[state.callback(BATCH)])


result = {"rank": ctx.rank, "size": ctx.size}
# A job that grew to 2 ranks with 1 sample of the epoch left: each rank still gets (the same) one sample.
state.consumed = N - 1
xs, ys = state.shard(x, y)
result["tiny"] = xs[:, 0].astype(int).tolist()
fit(xs, ys)
result["tiny_commits"] = list(commits)                   # the epoch's last step waits for epoch_done
state.epoch_done()
result["after_tiny_epoch"] = list(commits)
# A whole epoch: 37 samples over 2 ranks -> 19 each (one repeated), batches of 8, 8, 3.
xs, ys = state.shard(x, y)
result["full"] = xs[:, 0].astype(int).tolist()
commits.clear()
fit(xs, ys)
result["full_commits"] = list(commits)
try:
    state.shard(x, y)
except hk.UserError as exc:
    result["exhausted"] = str(exc)
state.epoch_done()
result["after_full_epoch"] = list(commits)
write_result(args.out, ctx.rank, result)
