"""Worker: hk.DistributedOptimizer(shard_optimizer_state=True) for Keras 3 against the same job unsharded.

float64, a global batch of 12 rows split over the ranks (so every world size takes the same steps), fit (a
compiled step on TensorFlow). Phases:

- ``train``: from one start, 20 optimizer steps unsharded, then sharded; each saves a checkpoint (gathered on
  rank 0), compared entry by entry; each rank reports its optimizer's bytes. With ``--ckpt``, the sharded
  checkpoint is kept there and the sharded job goes on 5 steps, reporting its weights.
- ``resume``: load ``--ckpt`` (sharded with ``--shard``), check that saving it again gives the same file,
  then 5 steps, reporting the weights.
- ``refusals``: what sharding cannot do, one UserError each.
"""

import argparse
import os

import numpy as np
from keras_common import parse_args
from rank_results import write_result

import hvdkit.keras as hk
from hvdkit.runtime.optimizer_record import OptimizerRecord, record_of

p = argparse.ArgumentParser()
p.add_argument("--phase", choices=["train", "resume", "refusals"], default="train")
p.add_argument("--optimizer", choices=["adam", "sgd", "adamw"], default="adam")
p.add_argument("--clip", choices=["none", "global", "each"], default="none")
p.add_argument("--accumulate", type=int, default=1)
p.add_argument("--ckpt")
p.add_argument("--shard", action="store_true")
p.add_argument("--keras-files", action="store_true", help="also save and load with Keras's own save_weights")
p.add_argument("--mixed", action="store_true", help="mixed_float16 (a LossScaleOptimizer), float32 weights")
p.add_argument("--embedding", action="store_true",
               help="an Embedding first (TensorFlow's gradient for it is sparse: IndexedSlices, rows repeated)")
p.add_argument("--overwrite-bias", action="store_true",
               help="the head's bias takes its gradient as its value (float8's overwrite_with_gradient)")
args = parse_args(p)

keras = hk.use_backend(args.mode)
ctx = hk.init(threads=1)
if args.mixed:
    keras.mixed_precision.set_global_policy("mixed_float16")
else:
    keras.config.set_floatx("float64")
GLOBAL, STEPS, MORE = 12, 20, 5
MAX_NORM = 0.5           # small enough to bind: the columns' norms reach it within the 20 steps
b = GLOBAL // ctx.size
rng = np.random.default_rng(0)
x_all = rng.standard_normal((GLOBAL * (STEPS + MORE) * args.accumulate, 16))
if args.embedding:       # 16 token ids a row out of 23: every batch looks rows up many times
    x_all = rng.integers(0, 23, x_all.shape)
y_all = rng.integers(0, 5, len(x_all))


def build():
    keras.utils.set_random_seed(7)        # every rank alike (the broadcast is tested elsewhere)
    model = keras.Sequential([
        keras.Input((16,)),
        *([keras.layers.Embedding(23, 3), keras.layers.Flatten()] if args.embedding else []),
        keras.layers.Dense(37, activation="tanh", kernel_constraint=keras.constraints.MaxNorm(MAX_NORM)),
        keras.layers.Dense(5, name="head")])
    if args.overwrite_bias:
        dense_layers(model)[1].bias.overwrite_with_gradient = True
    return model


def dense_layers(model):
    return [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]


def optimizer_for(shard):
    # Small enough to clip every step (a fresh model's gradients are far longer).
    clip = {"none": {}, "global": {"global_clipnorm": 0.05}, "each": {"clipnorm": 0.02}}[args.clip]
    accumulate = {"gradient_accumulation_steps": args.accumulate} if args.accumulate > 1 else {}
    if args.optimizer == "sgd":
        opt = keras.optimizers.SGD(0.05, momentum=0.9, **clip, **accumulate)
    elif args.optimizer == "adamw":
        opt = keras.optimizers.AdamW(0.01, weight_decay=0.1, **clip, **accumulate)
        opt.exclude_from_weight_decay(var_names=["bias"])
    else:
        opt = keras.optimizers.Adam(0.01, **clip, **accumulate)
    return hk.DistributedOptimizer(opt, shard_optimizer_state=shard)


def fit(model, steps, first):
    """``steps`` optimizer steps of the global batches from ``first`` on; this rank's rows of each."""
    rows = slice(first * GLOBAL * args.accumulate, (first + steps) * GLOBAL * args.accumulate)
    x, y = hk.shard_arrays(x_all[rows], y_all[rows])
    model.fit(x, y, batch_size=b, epochs=1, shuffle=False, verbose=0, callbacks=hk.callbacks())


def compiled(shard):
    model = build()
    opt = optimizer_for(shard)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if args.optimizer == "adamw":      # an exclusion by variable after the build (one by name came before it)
        opt.build(model.trainable_variables)
        opt.exclude_from_weight_decay(var_list=[dense_layers(model)[0].kernel])
    return model, opt


def read(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files if k != "header"}


def weights(model):
    return [float(v) for w in model.get_weights() for v in np.ravel(w)]


def state_bytes(opt):
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in opt.variables)


result = {"size": ctx.size, "rank": ctx.rank}
if args.phase == "train":
    files = {}
    for shard in (False, True):
        model, opt = compiled(shard)
        start = weights(model)
        fit(model, STEPS, 0)
        if args.keras_files and ctx.is_main:      # as ModelCheckpoint does: the writing rank alone
            model.save_weights(os.path.join(args.out, f"{shard}.weights.h5"))
        result[f"{'sharded' if shard else 'plain'}_bytes"] = state_bytes(opt)
        files[shard] = args.ckpt if shard and args.ckpt else os.path.join(args.out, f"ckpt-{shard}.npz")
        hk.save_checkpoint(files[shard], model, opt, step=STEPS)     # every rank: the slices go to rank 0
        result["moved"] = max(abs(a - c) for a, c in zip(start, weights(model)))
        kernel = keras.ops.convert_to_numpy(dense_layers(model)[0].kernel)
        result["constraint_bound"] = bool(abs(np.sqrt((kernel ** 2).sum(axis=0)).max() - MAX_NORM) < 1e-3)
        result["iterations"] = int(keras.ops.convert_to_numpy(opt.iterations))
    if ctx.is_main:
        plain, sharded = read(files[False]), read(files[True])
        result["same_entries"] = sorted(plain) == sorted(sharded)
        result["diff"] = {k: float(np.max(np.abs(plain[k] - sharded[k]))) if plain[k].size else 0.0 for k in plain}
    if args.keras_files:
        # An unsharded job's Keras file, loaded by every rank of a sharded one: each keeps its slices.
        model, opt = compiled(True)
        opt.build(model.trainable_variables)
        model.load_weights(os.path.join(args.out, "False.weights.h5"))
        loaded = os.path.join(args.out, "loaded.npz")
        hk.save_checkpoint(loaded, model, opt, step=STEPS)
        if ctx.is_main:
            again = read(loaded)
            result["keras_file_diff"] = max(float(np.max(np.abs(plain[k] - again[k]))) if plain[k].size else 0.0
                                            for k in plain)
    if args.ckpt:
        fit(model, MORE, STEPS)
        result["after"] = weights(model)
elif args.phase == "resume":
    model, opt = compiled(args.shard)
    hk.load_checkpoint(args.ckpt, model, opt)
    again = os.path.join(args.out, "again.npz")
    hk.save_checkpoint(again, model, opt, step=STEPS)
    if ctx.is_main:
        before, after = read(args.ckpt), read(again)
        result["resave_diff"] = max(float(np.max(np.abs(before[k] - after[k]))) if before[k].size else 0.0
                                    for k in before)
    if ctx.size == 1 and args.shard:
        # Keras's own file from one sharded rank holds every slice: the unsharded layout, which an unsharded
        # optimizer loads as its own.
        path = os.path.join(args.out, "one.weights.h5")
        model.save_weights(path)
        plain, plain_opt = build(), optimizer_for(False)
        plain.compile(optimizer=plain_opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        plain_opt.build(plain.trainable_variables)
        plain.load_weights(path)
        hk.save_checkpoint(os.path.join(args.out, "plain.npz"), plain, plain_opt, step=STEPS)
        mine, theirs = read(again), read(os.path.join(args.out, "plain.npz"))
        result["keras_file_diff"] = max(float(np.max(np.abs(mine[k] - theirs[k]))) if mine[k].size else 0.0
                                        for k in mine)
    fit(model, MORE, STEPS)
    result["after"] = weights(model)
    result["sharded"] = (record_of(opt) or OptimizerRecord()).sharded
else:
    errors = {}

    def refused(name, action):
        try:
            action()
        except hk.UserError as exc:
            errors[name] = str(exc)

    refused("lamb", lambda: hk.DistributedOptimizer(keras.optimizers.Lamb(0.01), shard_optimizer_state=True))
    refused("ema", lambda: hk.DistributedOptimizer(keras.optimizers.Adam(0.01, use_ema=True),
                                                   shard_optimizer_state=True))
    built = keras.optimizers.Adam(0.01)
    built.build(build().trainable_variables)
    refused("built", lambda: hk.DistributedOptimizer(built, shard_optimizer_state=True))
    model, opt = compiled(True)
    fit(model, 1, 0)
    refused("elastic", lambda: hk.elastic.ElasticState(model, opt))

    # A file with optimizer state loaded on rank 0 alone, then the broadcast that copies an unsharded state.
    plain, plain_opt = build(), hk.DistributedOptimizer(keras.optimizers.Adam(0.01))
    plain.compile(optimizer=plain_opt, loss="mse")
    plain_opt.build(plain.trainable_variables)
    weights_file = os.path.join(args.out, "plain.weights.h5")
    if ctx.is_main:
        plain.save_weights(weights_file)
    hk.metric_average(0.0, name="written")        # every rank waits for the file
    if ctx.is_main:
        model.load_weights(weights_file)
    refused("rank0_load", lambda: hk.broadcast_state(model, opt))

    # Horovod's habit: save under `if rank == 0:`. Rank 1's next collective (here a broadcast's) pairs with it on
    # TensorFlow, where eager collectives pair in call order.
    if ctx.is_main:
        refused("save_alone", lambda: hk.save_checkpoint(os.path.join(args.out, "alone.npz"), model, opt))
    else:
        refused("save_alone", lambda: hk.broadcast_state(model, opt))

    # A custom loop's first apply(grads), the ranks apart (no broadcast_state): the check sees the variables.
    import tensorflow as tf

    keras.utils.set_random_seed(ctx.rank)
    apart = keras.Sequential([keras.Input((16,)), keras.layers.Dense(3)])
    apart_opt = hk.DistributedOptimizer(keras.optimizers.SGD(0.1), shard_optimizer_state=True)
    apart_opt.build(apart.trainable_variables)
    with tf.GradientTape() as tape:
        loss = keras.ops.mean(apart(x_all[:4]) ** 2)
    grads = tape.gradient(loss, apart.trainable_variables)
    refused("apart", lambda: apart_opt.apply(grads))

    # The mixed policy set after the optimizer was wrapped: compile puts its LossScaleOptimizer outside.
    outside = hk.DistributedOptimizer(keras.optimizers.Adam(0.01), shard_optimizer_state=True)
    keras.mixed_precision.set_global_policy("mixed_float16")
    mixed = build()
    mixed.compile(optimizer=outside, loss="mse")
    refused("outside_loss_scale", lambda: mixed.fit(x_all[:12], x_all[:12, :5], verbose=0, callbacks=hk.callbacks()))
    keras.mixed_precision.set_global_policy("float64")

    # The script's own LossScaleOptimizer around the distributed one: the same outside, another message.
    wrapped = build()
    wrapped.compile(optimizer=keras.optimizers.LossScaleOptimizer(hk.DistributedOptimizer(keras.optimizers.Adam(0.01))),
                    loss="mse")
    refused("own_loss_scale", lambda: wrapped.fit(x_all[:12], x_all[:12, :5], verbose=0, callbacks=hk.callbacks()))

    # The callbacks' warmup sets the rate each batch, which a schedule's optimizer refuses (Keras's TypeError).
    scheduled = build()
    scheduled.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.Adam(
        keras.optimizers.schedules.CosineDecay(0.01, decay_steps=10))), loss="mse")
    refused("warmup_schedule", lambda: scheduled.fit(x_all[:12], x_all[:12, :5], verbose=0,
                                                     callbacks=hk.callbacks(warmup_epochs=1)))
    result["errors"] = errors
write_result(args.out, ctx.rank, result)
