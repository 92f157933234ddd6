"""Worker: model.fit with hk.callbacks(preemption_checkpoint=...); a signal on one rank stops every rank
at the same batch end with a checkpoint. --check-resume loads that checkpoint instead of training."""

import argparse
import json
import os
import time

from keras_common import keras_for, parse_args_and_select_backend

p = argparse.ArgumentParser()
p.add_argument("--ckpt", required=True)
p.add_argument("--check-resume", action="store_true")
args = parse_args_and_select_backend(p)

import numpy as np  # noqa: E402

import hvdkit.keras as hk  # noqa: E402

ctx = hk.init(seed=1, threads=1)
keras = keras_for(args.mode)
with open(os.path.join(args.out, f"pid{ctx.rank}"), "w") as f:
    f.write(str(os.getpid()))
rng = np.random.default_rng(0)
x, y = hk.shard_arrays(rng.standard_normal((480, 6)), rng.standard_normal((480, 1)))
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")

if args.check_resume:
    extra = hk.load_checkpoint(args.ckpt, model, model.optimizer)
    with open(os.path.join(args.out, f"rank{ctx.rank}.json"), "w") as f:
        json.dump({"size": ctx.size, "epoch": extra["epoch"], "batch": extra["batch"]}, f)
    raise SystemExit(0)


class Progress(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if ctx.is_main:
            with open(os.path.join(args.out, "progress"), "w") as f:
                f.write(str(batch + 1))
        time.sleep(0.2)


cbs = hk.callbacks(Progress(), preemption_checkpoint=args.ckpt)
try:
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=cbs)
except SystemExit:
    guard = next(cb for cb in cbs if type(cb).__name__ == "PreemptionCheckpoint")
    with open(os.path.join(args.out, f"preempted{ctx.rank}.json"), "w") as f:
        json.dump({"stopped_at": list(guard.stopped_at), "signal": guard.guard.received}, f)
    raise
