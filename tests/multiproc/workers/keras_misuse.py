"""Worker: the Keras scripts users wrote that ran silently wrong; each must stop with, or warn of, the fix.

--case no_callbacks:       fit without hk.callbacks, so nothing copies rank 0's weights
--case custom_loop:        apply_gradients without hk.broadcast_state
--case string_optimizer:   compile(optimizer="adam"): no averaging at all
--case unsharded_shuffled: every rank fits the whole, shuffled data set
--case sharded_shuffled:   all done right: no error and no warning
"""

import argparse

import numpy as np
from keras_common import parse_args, record_hvdkit_lines
from rank_results import write_result

import hvdkit.keras as hk

p = argparse.ArgumentParser()
p.add_argument("--case", required=True, choices=["no_callbacks", "custom_loop", "string_optimizer",
                                                "unsharded_shuffled", "sharded_shuffled", "unsharded_preshuffled",
                                                "shuffle_then_shard", "nan_loss"])
args = parse_args(p)

keras = hk.use_backend(args.mode)   # before init, which reads the backend
ctx = hk.init(seed=7, threads=1)
if args.case in ("no_callbacks", "custom_loop"):
    hk.seed_everything(7, per_rank=True)   # seed + rank: the ranks build different weights

warnings = record_hvdkit_lines()

rng = np.random.default_rng(0)
x = rng.standard_normal((64, 8)).astype("float32")
y = (x[:, :4].argmax(1)).astype("int64")
ids = np.arange(len(x))
if args.case == "unsharded_preshuffled":     # the script shuffles with a generator of its own, seeded per process
    order = np.random.default_rng(100 + ctx.rank).permutation(len(x))
    x, y = x[order], y[order]
elif args.case == "shuffle_then_shard":      # as public examples do: numpy's global permutation, then shard
    order = np.random.permutation(len(x))
    x, y, ids = hk.shard_arrays(x[order], y[order], ids[order])
elif args.case != "unsharded_shuffled":
    x, y = hk.shard_arrays(x, y)
if args.case == "nan_loss" and ctx.rank == 1:
    x[16:24] = np.nan                          # rank 1's third batch (fit does not shuffle in this case)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
optimizer = "adam" if args.case == "string_optimizer" else hk.DistributedOptimizer(keras.optimizers.SGD(0.1))
steps = []


class CountSteps(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        steps.append(batch)


error = None
try:
    if args.case == "custom_loop":
        import tensorflow as tf

        for i in range(2):
            with tf.GradientTape() as tape:
                value = loss(y[i * 8:(i + 1) * 8], model(x[i * 8:(i + 1) * 8], training=True))
            optimizer.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
            steps.append(i)
    else:
        model.compile(optimizer=optimizer, loss=loss)
        cbs = [CountSteps()] if args.case == "no_callbacks" else hk.callbacks(CountSteps())
        model.fit(x, y, batch_size=8, epochs=1, shuffle=args.case != "nan_loss", verbose=0, callbacks=cbs)
except Exception as exc:  # noqa: BLE001 - the test reads the type and message
    error = f"{type(exc).__name__}: {exc}"
write_result(args.out, ctx.rank, {"rank": ctx.rank, "size": ctx.size, "error": error, "steps": len(steps),
                                  "warnings": warnings, "ids": ids.tolist()})
