"""Worker: Keras 3 on TensorFlow with XLA on, as on every GPU machine; each run against the same run with XLA off.

Each case trains one model twice from the same weights on the same shards, fit
with ``compile(jit_compile=True)`` and with ``jit_compile=False``, and reports
the largest difference of the weights and optimizer variables after STEPS
steps. Then the two ways XLA cannot hold Horovod's allreduce must each stop
with hvdkit's one-line fix: a custom ``tf.function(jit_compile=True)`` step
that applies gradients inside, and fit without ``hk.callbacks()``.
"""

import argparse
import logging

import numpy as np
from keras_common import parse_args
from rank_results import write_result

import hvdkit.keras as hk

p = argparse.ArgumentParser()
args = parse_args(p)

keras = hk.use_backend(args.mode)
ctx = hk.init(seed=3, threads=1)
import tensorflow as tf  # noqa: E402  (after hk.use_backend, which picks Keras's backend first)

B, STEPS = 16, 6
rng = np.random.default_rng(0)
x_all = rng.standard_normal((STEPS * B * ctx.size, 12)).astype("float32")
y_all = rng.integers(0, 3, STEPS * B * ctx.size)
x, y = hk.shard_arrays(x_all, y_all)


warnings = []


class Record(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())


logging.getLogger("hvdkit.keras").addHandler(Record())


class ClippedWeights(keras.Sequential):
    """A train_step override with work after the update (WGAN's weight clipping): its step runs without XLA."""

    def train_step(self, data):
        logs = super().train_step(data)
        for v in self.trainable_variables:
            v.assign(tf.clip_by_value(v, -0.05, 0.05))
        return logs


def build(case="sgd"):
    keras.utils.set_random_seed(5)
    layers = [keras.Input((12,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3),
              keras.layers.Activation("softmax", dtype="float32")]
    return ClippedWeights(layers) if case == "override" else keras.Sequential(layers)


def optimizer(case):
    if case == "adam_sharded":
        return hk.DistributedOptimizer(keras.optimizers.Adam(0.01, global_clipnorm=1.0), shard_optimizer_state=True)
    if case == "accumulate":
        return hk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9, gradient_accumulation_steps=2))
    return hk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))


def train(case, jit):
    model = build(case)
    opt = optimizer(case)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"], jit_compile=jit)
    history = model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0, callbacks=hk.callbacks())
    split = getattr(model.train_function, "hvdkit_xla_split", None)
    evaluated = model.evaluate(x, y, batch_size=B, verbose=0)        # with XLA whole where jit stays on
    state = [v.numpy() for v in model.variables] + [np.asarray(v.numpy()) for v in opt.variables]
    return state, {k: float(v[-1]) for k, v in history.history.items()}, split, model.jit_compile, evaluated


initial = [v.numpy() for v in build().variables]
result = {"size": ctx.size, "cases": {}}
# mixed_float16 last: the global policy puts a LossScaleOptimizer inside hk.DistributedOptimizer
for case in ("sgd", "adam_sharded", "accumulate", "override", "mixed_float16"):
    if case == "mixed_float16":
        keras.mixed_precision.set_global_policy("mixed_float16")
    warnings.clear()
    with_xla, logs_xla, split, jit_after, eval_xla = train(case, True)
    warned = list(warnings)
    without, logs_plain, _, _, eval_plain = train(case, False)
    result["cases"][case] = {
        "max_diff": max(float(np.max(np.abs(np.asarray(a, "float64") - b))) if a.size else 0.0
                        for a, b in zip(with_xla, without)),
        "moved": max(float(np.max(np.abs(np.asarray(a, "float64") - b))) for a, b in zip(with_xla, initial)),
        "loss_xla": logs_xla["loss"], "loss_plain": logs_plain["loss"], "split": split, "jit_after": bool(jit_after),
        "eval_diff": max(abs(a - b) for a, b in zip(eval_xla, eval_plain)), "warnings": warned}
keras.mixed_precision.set_global_policy("float32")


def error_of(fn):
    try:
        fn()
    except hk.UserError as exc:
        return str(exc)
    return None


def custom_xla_loop():
    model = build()
    opt = optimizer("sgd")
    hk.broadcast_state(model, opt)

    @tf.function(jit_compile=True)
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = keras.losses.sparse_categorical_crossentropy(yb, model(xb, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    step(x[:B], y[:B])


def fit_without_callbacks():
    model = build()
    model.compile(optimizer=optimizer("sgd"), loss="sparse_categorical_crossentropy", jit_compile=True)
    model.fit(x, y, batch_size=B, epochs=1, verbose=0)


def loss_scale_outside():
    opt = optimizer("sgd")
    keras.mixed_precision.set_global_policy("mixed_float16")     # after the wrap: compile puts the scale outside
    try:
        model = build()
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", jit_compile=True)
        model.fit(x, y, batch_size=B, epochs=1, verbose=0, callbacks=hk.callbacks())
    finally:
        keras.mixed_precision.set_global_policy("float32")


result["custom_loop_error"] = error_of(custom_xla_loop)
result["no_callbacks_error"] = error_of(fit_without_callbacks)
result["loss_scale_outside_error"] = error_of(loss_scale_outside)
write_result(args.out, ctx.rank, result)
