"""Worker: hvdkit.keras in one mode; N ranks x batch B vs one process on batch N*B (rank 0 computes both).

Ranks build their model from different seeds, so identical weights afterwards
prove the broadcast; rank 0's reference starts from rank 0's initial weights.
"""

import argparse
import hashlib

import numpy as np
from keras_common import parse_args
from rank_results import write_result

import hvdkit.keras as hk

p = argparse.ArgumentParser()
p.add_argument("--optimizer", choices=["sgd", "adam"], required=True)
p.add_argument("--loop", choices=["fit", "custom"], default="fit")
p.add_argument("--op", choices=["average", "adasum"], default="average")
p.add_argument("--unsharded", action="store_true", help="give every rank the same data (expect a warning)")
args = parse_args(p)

keras = hk.use_backend(args.mode)   # before init, which reads the backend
ctx = hk.init(threads=1)
# float64, so that 1e-5 measures the algorithm rather than float32 roundoff.
(keras.backend.set_floatx if args.mode == "tf_keras" else keras.config.set_floatx)("float64")

B, STEPS = 8, 2


def build(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)])


def make_optimizer():
    if args.optimizer == "sgd":
        return keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    return keras.optimizers.Adam(learning_rate=0.01)


def variables_of(optimizer):
    v = optimizer.variables
    return list(v() if callable(v) else v)


def digest(arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.asarray(a, dtype=np.float64).tobytes())
    return h.hexdigest()


def to_numpy(v):
    return v.numpy() if hasattr(v, "numpy") else v.value.detach().cpu().numpy()


rng = np.random.default_rng(0)
x_all = rng.standard_normal((STEPS, ctx.size * B, 16))
y_all = rng.integers(0, 4, (STEPS, ctx.size * B))
shard = 0 if args.unsharded else ctx.rank
xs = np.concatenate([x_all[s, shard * B:(shard + 1) * B] for s in range(STEPS)])
ys = np.concatenate([y_all[s, shard * B:(shard + 1) * B] for s in range(STEPS)])
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

model = build(100 + ctx.rank)
initial = [w.copy() for w in model.get_weights()]
opt = hk.DistributedOptimizer(make_optimizer(), op=args.op)
after_first = {}


class RecordFirstBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:
            after_first["model"] = digest(self.model.get_weights())
            after_first["optimizer"] = digest([to_numpy(v) for v in variables_of(self.model.optimizer)])


if args.loop == "fit":
    model.compile(optimizer=opt, loss=loss_fn)
    history = model.fit(xs, ys, batch_size=B, epochs=1, shuffle=False, verbose=0,
                        callbacks=hk.callbacks(RecordFirstBatch()))
    after_first["epoch_loss"] = history.history["loss"]     # averaged over ranks by the callback
else:
    import tensorflow as tf

    hk.broadcast_state(model, opt)
    for s in range(STEPS):
        with tf.GradientTape() as tape:
            loss = loss_fn(ys[s * B:(s + 1) * B], model(xs[s * B:(s + 1) * B], training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if s == 0:
            after_first["model"] = digest(model.get_weights())
            after_first["optimizer"] = digest([to_numpy(v) for v in variables_of(opt)])

result = {"rank": ctx.rank, "size": ctx.size, "backend": ctx.mode, "initial": digest(initial),
          "after_first": after_first, "final": digest(model.get_weights()),
          "optimizer_class": type(opt).__name__}
if ctx.rank == 0:
    reference = build(100)
    assert digest(reference.get_weights()) == digest(initial)
    reference.compile(optimizer=make_optimizer(), loss=loss_fn)
    reference.fit(x_all.reshape(-1, 16), y_all.reshape(-1), batch_size=ctx.size * B, epochs=1,
                  shuffle=False, verbose=0)
    result["max_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), reference.get_weights()))
    result["change"] = max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), initial))
write_result(args.out, ctx.rank, result)
