"""Worker: a Keras custom training loop as docs/ADAPTERS.md's recipes write it, on TensorFlow and on Keras's
torch backend (issue 54, cases 8 and 9), over keras_metrics_setup's data and model.

The loop reads a tf.data pipeline on both backends. --unsharded leaves out hk.shard_dataset, as the
outside-script trial did: every rank trained on the same data and nothing said so. After training, each rank
validates its unpadded shard with fresh metrics and hk.sync_metrics, and rank 0 saves the weights (--weights)
for the test's one-process reference. Each rank writes whether hk.check_sharded found its first batch on every
rank, the hvdkit lines it logged, its validation metrics and its final weights' digest (the ranks must agree).
"""

import argparse
import hashlib

import numpy as np
from keras_common import parse_args, record_hvdkit_lines
from keras_metrics_setup import build, data, metrics, validate
from rank_results import write_result

import hvdkit.keras as hk

p = argparse.ArgumentParser()
p.add_argument("--unsharded", action="store_true")
p.add_argument("--weights", required=True)
args = parse_args(p)
keras = hk.use_backend(args.mode)
ctx = hk.init(seed=0, threads=1)
import tensorflow as tf  # noqa: E402 -- after the backend is chosen

warnings = record_hvdkit_lines()
x, y, x_val, y_val = data()

ds = tf.data.Dataset.from_tensor_slices((x, y))
if not args.unsharded:
    ds = hk.shard_dataset(ds)                       # before shuffle and batch: each rank its own rows
ds = ds.shuffle(len(x), seed=0).batch(16)

model = build(keras)
optimizer = hk.DistributedOptimizer(keras.optimizers.SGD(hk.scale_lr(0.05)))
hk.broadcast_state(model, optimizer)
loss_fn = keras.losses.BinaryCrossentropy()

if args.mode == "torch":
    import torch

    def train_step(xb, yb):
        model.zero_grad()
        loss = loss_fn(yb, model(xb, training=True))
        loss.backward()
        gradients = [v.value.grad for v in model.trainable_variables]
        with torch.no_grad():
            optimizer.apply(gradients, model.trainable_variables)
else:
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

unsharded = None
for _epoch in range(2):
    for xb, yb in (ds.as_numpy_iterator() if args.mode == "torch" else ds):     # torch takes numpy, not tf tensors
        if unsharded is None:
            unsharded = hk.check_sharded(xb, yb)    # once, on every rank
        train_step(xb, yb)

validation = validate(hk, model, hk.shard_arrays(x_val, y_val, pad=False), metrics(keras))   # every row once
if ctx.is_main:
    model.save_weights(args.weights)

digest = hashlib.sha256(b"".join(np.asarray(w, np.float64).tobytes() for w in model.get_weights())).hexdigest()
write_result(args.out, ctx.rank, {"size": ctx.size, "unsharded": unsharded, "warnings": warnings, "final": digest,
                                  "validation": validation})
