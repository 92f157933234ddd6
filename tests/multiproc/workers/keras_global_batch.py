"""Worker: a fixed global batch for Keras (hk.global_batches), float64, BatchNorm + Dropout + Adam.

Trains --steps optimizer steps in all (5 a epoch: 60 samples, global batch 12 in micro-batches of 2) with
hk.fit and hk.callbacks(preemption_checkpoint=--ckpt). --preempt-at S: rank --victim sends itself SIGTERM
once step S is done; every rank then checkpoints at the next step's end and exits 75. --resume goes on
from the newest checkpoint on however many ranks this run has. At the end every rank calls
hk.save_checkpoint(--out/final.npz) (rank 0 writes it, sharded state gathered) and writes its size and steps.
--plain: one process, plain Keras (no hvdkit batches or optimizer), batches of 12 in the same order.
"""

import argparse
import os
import signal

import numpy as np
from keras_common import parse_args
from rank_results import write_result

import hvdkit.keras as hk

p = argparse.ArgumentParser()
p.add_argument("--ckpt", required=True)
p.add_argument("--resume", action="store_true")
p.add_argument("--steps", type=int, default=15)
p.add_argument("--preempt-at", type=int, default=None, help="the step after which --victim gets SIGTERM")
p.add_argument("--victim", type=int, default=1)
p.add_argument("--shard", action="store_true", help="shard_optimizer_state=True")
p.add_argument("--micro-batch", type=int, default=2)
p.add_argument("--mlp", action="store_true", help="no BatchNorm or Dropout, whose batches would differ in --plain")
p.add_argument("--plain", action="store_true", help="one process, plain Keras, whole steps as batches")
p.add_argument("--clipnorm", type=float, default=None)
p.add_argument("--jit", action="store_true", help="compile(jit_compile=True): XLA, as Keras turns on where a GPU is")
args = parse_args(p)

keras = hk.use_backend(args.mode)
keras.config.set_floatx("float64")
ctx = hk.init(seed=1, threads=1)
rng = np.random.default_rng(0)
x, y = rng.standard_normal((60, 5)), rng.integers(0, 3, 60)

keras.utils.set_random_seed(5)
if args.mlp:
    layers = [keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(3)]
else:   # no bias before BatchNorm: its true gradient is 0, so Adam would step on rounding noise alone
    layers = [keras.layers.Dense(16, use_bias=False), keras.layers.BatchNormalization(), keras.layers.ReLU(),
              keras.layers.Dropout(0.3), keras.layers.Dense(3)]
model = keras.Sequential([keras.Input((5,)), *layers])
adam = keras.optimizers.Adam(0.01, clipnorm=args.clipnorm)
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")   # float32 on torch else
epochs = -(-args.steps // 5)

if args.plain:
    model.compile(optimizer=adam, loss=loss)
    for epoch in range(epochs):
        order = np.random.default_rng(7 + epoch).permutation(60)
        for step in range(5):
            rows = order[12 * step:12 * step + 12]
            model.train_on_batch(x[rows], y[rows])
    write_result(args.out, 0, {"size": 1, "weights": [w.tolist() for w in model.get_weights()]})
    raise SystemExit(0)

batches = hk.global_batches(x, y, global_batch=12, micro_batch=args.micro_batch, seed=7)
optimizer = hk.DistributedOptimizer(adam, global_batch=batches, shard_optimizer_state=args.shard)
model.compile(optimizer=optimizer, loss=loss, jit_compile=args.jit or "auto")
ckpt = os.path.join(args.ckpt, "")
if args.resume:
    batches.resume(hk.load_checkpoint(ckpt, model, optimizer))
resumed_at = batches.epoch * 5 + batches.start_step


class Victim(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        done = batches.epoch * 5 + batches.position(batch + 1) // 12
        if args.preempt_at == done and ctx.rank == args.victim and batches.at_step_end(batch + 1):
            os.kill(os.getpid(), signal.SIGTERM)


try:
    hk.fit(model, batches, epochs=epochs, verbose=0, callbacks=hk.callbacks(Victim(), preemption_checkpoint=ckpt))
except SystemExit:
    write_result(args.out, ctx.rank, {"size": ctx.size, "epoch": batches.epoch}, prefix="preempted")
    raise
hk.save_checkpoint(os.path.join(args.out, "final.npz"), model, optimizer)
write_result(args.out, ctx.rank, {"size": ctx.size, "resumed_at": resumed_at,
                                  "iterations": int(np.asarray(optimizer.iterations))})
