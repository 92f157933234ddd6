"""Worker: model.fit with hk.callbacks(preemption_checkpoint=...); a signal on one rank stops every rank
at the same batch end with a checkpoint. --check-resume loads that checkpoint instead of training."""

import argparse
import os
import time

import numpy as np
from keras_common import parse_args
from rank_results import write_result

import hvdkit.keras as hk

p = argparse.ArgumentParser()
p.add_argument("--ckpt", required=True)
p.add_argument("--check-resume", action="store_true")
args = parse_args(p)

keras = hk.use_backend(args.mode)   # before init, which reads the backend
ctx = hk.init(seed=1, threads=1)
with open(os.path.join(args.out, f"pid{ctx.rank}"), "w") as f:
    f.write(str(os.getpid()))
rng = np.random.default_rng(0)
x, y = hk.shard_arrays(rng.standard_normal((480, 6)), rng.standard_normal((480, 1)))
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")

if args.check_resume:
    extra = hk.load_checkpoint(args.ckpt, model, model.optimizer)
    write_result(args.out, ctx.rank, {"size": ctx.size, "epoch": extra["epoch"], "batch": extra["batch"]})
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
    write_result(args.out, ctx.rank, {"stopped_at": list(guard.stopped_at), "signal": guard.guard.received},
                 prefix="preempted")
    raise
