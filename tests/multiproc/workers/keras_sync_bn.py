"""Worker: synchronized BatchNorm; N ranks x batch B against one process on batch N*B, in float64.

Every rank builds the same weights (same seed) twice: a model with the layer
under test, fed its own B samples, and a reference with plain
``BatchNormalization`` fed all N*B samples. It writes how far apart the two are
in outputs (its own rows), moving statistics and gradients (the distributed
ones averaged over ranks, as DistributedOptimizer does), then after
``model.fit`` on two batches. ``--layer plain`` puts plain BatchNormalization in
the distributed model too: the differences must then be large, which shows
the test can fail.

--layer hvdkit: hvdkit.keras.SyncBatchNormalization (all three modes).
--layer horovod: horovod.tensorflow.SyncBatchNormalization (Keras 3 on TF, or tf-keras).
"""

import argparse

import numpy as np
from keras_common import parse_args
from rank_results import write_result

import hvdkit.keras as hk

p = argparse.ArgumentParser()
p.add_argument("--layer", choices=["hvdkit", "horovod", "plain"], required=True)
args = parse_args(p)

keras = hk.use_backend(args.mode)   # before init, which reads the backend
ctx = hk.init(threads=1)
(keras.backend.set_floatx if args.mode == "tf_keras" else keras.config.set_floatx)("float64")
B, FEATURES = 6, 5


def bn_layer():
    if args.layer == "hvdkit":
        return hk.SyncBatchNormalization(momentum=0.5)
    if args.layer == "horovod":
        import horovod.tensorflow as hvd

        return hvd.SyncBatchNormalization(momentum=0.5)
    return keras.layers.BatchNormalization(momentum=0.5)


def build(distributed):
    keras.utils.set_random_seed(7)
    bn = bn_layer() if distributed else keras.layers.BatchNormalization(momentum=0.5)
    # (batch, 3, features): BatchNorm reduces over batch and the middle axis.
    model = keras.Sequential([keras.Input((3, FEATURES)), keras.layers.Dense(4), bn, keras.layers.Dense(2)])
    return model, bn


def to_numpy(t):
    if hasattr(t, "numpy") and not hasattr(t, "detach"):
        return np.asarray(t.numpy())
    if hasattr(t, "value") and not hasattr(t, "detach"):   # a Keras 3 torch variable
        t = t.value
    return t.detach().cpu().numpy()


def forward_and_gradients(model, x, y):
    """Outputs in training mode and d(mean squared error)/d(trainable weights)."""
    if args.mode == "torch":
        import torch

        out = model(torch.as_tensor(x), training=True)
        loss = torch.mean((out - torch.as_tensor(y)) ** 2)
        variables = [v.value for v in model.trainable_weights]
        grads = torch.autograd.grad(loss, variables)
        return to_numpy(out), [to_numpy(g) for g in grads]
    import tensorflow as tf

    with tf.GradientTape() as tape:
        out = model(tf.constant(x), training=True)
        loss = tf.reduce_mean((out - tf.constant(y)) ** 2)
    grads = tape.gradient(loss, model.trainable_weights)
    return to_numpy(out), [to_numpy(g) for g in grads]


def moving_stats(bn):
    return [to_numpy(bn.moving_mean), to_numpy(bn.moving_variance)]


def max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


rng = np.random.default_rng(0)
x_all = rng.standard_normal((ctx.size * B, 3, FEATURES)) * 2.0 + 1.5
y_all = rng.standard_normal((ctx.size * B, 3, 2))
mine = slice(ctx.rank * B, (ctx.rank + 1) * B)

model, bn = build(distributed=True)
ref, ref_bn = build(distributed=False)
out, grads = forward_and_gradients(model, x_all[mine], y_all[mine])
ref_out, ref_grads = forward_and_gradients(ref, x_all, y_all)
every_rank = hk.hvd.allgather_object(grads, name="grads")
mean_grads = [np.mean([rank_grads[i] for rank_grads in every_rank], axis=0) for i in range(len(grads))]

result = {
    "size": ctx.size, "backend": ctx.mode, "layer": type(bn).__name__, "module": type(bn).__module__,
    "output_diff": max_diff([out], [ref_out[mine]]),
    "stats_diff": max_diff(moving_stats(bn), moving_stats(ref_bn)),
    "grad_diff": max_diff(mean_grads, ref_grads),
    "grad_scale": max(float(np.max(np.abs(g))) for g in ref_grads),
}

# Then training: two fit steps with hvdkit's optimizer against plain SGD on the global batch.
model, bn = build(distributed=True)
ref, ref_bn = build(distributed=False)
model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
ref.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
local_x = np.concatenate([x_all[mine], x_all[mine][::-1]])
local_y = np.concatenate([y_all[mine], y_all[mine][::-1]])
global_x = np.concatenate([x_all, np.concatenate([x_all[r * B:(r + 1) * B][::-1] for r in range(ctx.size)])])
global_y = np.concatenate([y_all, np.concatenate([y_all[r * B:(r + 1) * B][::-1] for r in range(ctx.size)])])
model.fit(local_x, local_y, batch_size=B, epochs=1, shuffle=False, verbose=0)
ref.fit(global_x, global_y, batch_size=ctx.size * B, epochs=1, shuffle=False, verbose=0)
result["fit_weights_diff"] = max_diff(model.get_weights(), ref.get_weights())
result["fit_stats_diff"] = max_diff(moving_stats(bn), moving_stats(ref_bn))

write_result(args.out, ctx.rank, result)
