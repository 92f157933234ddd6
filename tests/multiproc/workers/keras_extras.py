"""Worker: hvdkit.keras mixed precision training, and checkpoint save/load across fresh processes."""

import argparse
import os

import numpy as np
from keras_common import parse_args
from rank_results import write_result

import hvdkit.keras as hk

p = argparse.ArgumentParser()
p.add_argument("--task", choices=["mixed_precision", "save", "load", "warmup_metrics", "warmup_unsized"], required=True)
args = parse_args(p)

keras = hk.use_backend(args.mode)   # before init, which reads the backend
ctx = hk.init(threads=1)
if args.task == "mixed_precision":
    keras.mixed_precision.set_global_policy("mixed_float16")


def build(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(4, dtype="float32")])


rng = np.random.default_rng(0)
x = rng.standard_normal((256, 16)).astype("float32")
y = (x[:, :4].argmax(1)).astype("int64")                 # learnable: the largest of the first 4 features
x, y = hk.shard_arrays(x, y)
model = build(10 + ctx.rank)
opt = hk.DistributedOptimizer(keras.optimizers.Adam(hk.scale_lr(0.005)))
model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
ckpt = os.path.join(args.out, "ckpt.npz")
result = {"rank": ctx.rank, "size": ctx.size, "optimizer_class": type(opt).__name__}
if args.task == "mixed_precision":
    history = model.fit(x, y, batch_size=16, epochs=4, verbose=0, callbacks=hk.callbacks(warmup_epochs=1))
    result["losses"] = history.history["loss"]
    result["compute_dtype"] = str(model.layers[0].compute_dtype)
elif args.task == "warmup_metrics":
    lrs, local_logs = [], []

    class RecordLocal(keras.callbacks.Callback):         # runs before hvdkit's: sees this rank's own metrics
        def on_epoch_end(self, epoch, logs=None):
            local_logs.append(dict(logs))

    class RecordLR(keras.callbacks.Callback):           # runs after hvdkit's warmup has set the rate
        def on_train_batch_begin(self, batch, logs=None):
            lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))

    writer = keras.callbacks.CSVLogger(os.path.join(args.out, "history.csv"))   # writes a file: rank 0 only
    cbs = hk.callbacks(RecordLR(), writer, warmup_epochs=1)
    result["callbacks"] = [type(cb).__name__ for cb in cbs]
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[RecordLocal()] + cbs)
    result.update(lrs=lrs, local=local_logs, history=history.history, target_lr=hk.scale_lr(0.005),
                  steps=len(lrs) // 2)
elif args.task == "warmup_unsized":                   # tf.data of unknown length: fit does not know its steps
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda *_: True).batch(16)
    try:
        model.fit(data, epochs=1, verbose=0, callbacks=hk.callbacks(warmup_epochs=1))
    except hk.UserError as e:
        result["error"] = str(e)
    lrs = []

    class RecordLR(keras.callbacks.Callback):           # at the batch's end: an unsized epoch begins one more
        def on_train_batch_end(self, batch, logs=None):
            lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))

    model.fit(data, epochs=2, verbose=0, callbacks=hk.callbacks(RecordLR(), warmup_steps=12))
    result.update(lrs=lrs, target_lr=hk.scale_lr(0.005))
elif args.task == "save":
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=hk.callbacks())
    result["wrote"] = hk.save_checkpoint(ckpt, model, opt, epoch=0)
    result["files"] = sorted(os.listdir(args.out))
else:
    hk.broadcast_state(model, opt)                      # builds the optimizer
    result["extra"] = hk.load_checkpoint(ckpt, model, opt)
weights = [w.tolist() for w in model.get_weights()]
result["weights"] = weights
v = opt.variables
result["optimizer"] = [np.asarray(t.numpy() if hasattr(t, "numpy") else t.value.cpu().numpy()).tolist()
                       for t in (v() if callable(v) else v)]
write_result(args.out, ctx.rank, result)
