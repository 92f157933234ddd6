"""Worker: model.fit with hk.callbacks(); one rank can sleep inside its loss (in the traced step) on purpose."""

import argparse
import time

import numpy as np
from keras_common import parse_args
from rank_results import write_result

p = argparse.ArgumentParser()
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--sleep-ms", type=float, default=40.0)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--samples", type=int, default=640)
args = parse_args(p)

import hvdkit.keras as hk  # noqa: E402

keras = hk.use_backend(args.mode)
ctx = hk.init(seed=0, threads=1)
rng = np.random.default_rng(0)
x, y = hk.shard_arrays(rng.normal(size=(args.samples, 8)).astype("float32"), rng.integers(0, 4, args.samples))
slow = ctx.rank == args.slow_rank


def sleep_if_slow(t):
    if slow:
        time.sleep(args.sleep_ms / 1e3)
    return t


class Slow(keras.layers.Layer):
    """Identity; on the slow rank it sleeps first, inside the step (before the allreduce), as slow compute would."""

    def call(self, inputs):
        if args.mode == "torch":
            return sleep_if_slow(inputs)
        import tensorflow as tf

        out = tf.numpy_function(sleep_if_slow, [inputs], inputs.dtype, stateful=True)
        out.set_shape(inputs.shape)
        return out

    def compute_output_shape(self, input_shape):
        return input_shape


model = keras.Sequential([keras.Input((8,)), Slow(), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(4)])
model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(hk.scale_lr(0.01))),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=32, epochs=args.epochs, verbose=0, callbacks=hk.callbacks())
write_result(args.out, ctx.rank, {"size": ctx.size})
