"""Worker: a Keras custom training loop over tf.data, as docs/ADAPTERS.md's recipe writes it (issue 54, case 9).

--unsharded leaves out hk.shard_dataset, as the outside-script trial did: every rank trained on the same data
and nothing said so. Each rank writes whether hk.check_sharded found its first batch on every rank, the
hvdkit lines it logged, and its final weights' digest (the ranks must agree).
"""

import argparse
import hashlib

import numpy as np
from keras_common import parse_args, record_hvdkit_lines
from rank_results import write_result

import hvdkit.keras as hk

p = argparse.ArgumentParser()
p.add_argument("--unsharded", action="store_true")
args = parse_args(p)
keras = hk.use_backend(args.mode)
ctx = hk.init(seed=0, threads=1)
import tensorflow as tf  # noqa: E402 -- after the backend is chosen

warnings = record_hvdkit_lines()

rng = np.random.default_rng(0)
x = rng.standard_normal((200, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("float32")[:, None]

ds = tf.data.Dataset.from_tensor_slices((x, y))
if not args.unsharded:
    ds = hk.shard_dataset(ds)                       # before shuffle and batch: each rank its own rows
ds = ds.shuffle(200, seed=0).batch(16)

model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
optimizer = hk.DistributedOptimizer(keras.optimizers.SGD(hk.scale_lr(0.05)))
hk.broadcast_state(model, optimizer)
loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
unsharded = None
for xb, yb in ds:
    if unsharded is None:
        unsharded = hk.check_sharded(xb, yb)        # once, on every rank
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, model(xb, training=True))
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

digest = hashlib.sha256(b"".join(np.asarray(w, np.float64).tobytes() for w in model.get_weights())).hexdigest()
write_result(args.out, ctx.rank, {"size": ctx.size, "unsharded": unsharded, "warnings": warnings, "final": digest})
