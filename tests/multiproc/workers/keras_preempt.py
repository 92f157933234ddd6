"""Worker: model.fit with hk.callbacks(preemption_checkpoint=...); a signal on one rank stops every rank
at the same batch end with a checkpoint. --check-resume loads that checkpoint instead of training.
--background also saves to the same file after every batch with blocking=False, each background write taking a
second longer (a slow file system), so that one is in flight when the signal comes."""

import argparse
import os
import threading
import time

import numpy as np
from keras_common import parse_args
from rank_results import write_result

import hvdkit.keras as hk

p = argparse.ArgumentParser()
p.add_argument("--ckpt", required=True)
p.add_argument("--check-resume", action="store_true")
p.add_argument("--background", action="store_true")
args = parse_args(p)
if args.background:
    import hvdkit.runtime.checkpoint as core

    def slow_save_to(*a, _save_to=core.save_to, **kw):
        if threading.current_thread() is not threading.main_thread():     # the background writes only
            time.sleep(1.0)
        return _save_to(*a, **kw)

    core.save_to = slow_save_to

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
    write_result(args.out, ctx.rank, {"size": ctx.size, "epoch": extra["epoch"], "batch": extra["batch"],
                                      "periodic": extra.get("periodic", False)})
    raise SystemExit(0)


class Progress(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if ctx.is_main:
            with open(os.path.join(args.out, "progress"), "w") as f:
                f.write(str(batch + 1))
        time.sleep(0.2)


class SaveInTheBackground(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        hk.save_checkpoint(args.ckpt, model, model.optimizer, blocking=False, epoch=self.epoch, batch=batch + 1,
                           periodic=True)


cbs = hk.callbacks(Progress(), *([SaveInTheBackground()] if args.background else []),
                   preemption_checkpoint=args.ckpt)
try:
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=cbs)
except SystemExit:
    guard = next(cb for cb in cbs if type(cb).__name__ == "PreemptionCheckpoint")
    write_result(args.out, ctx.rank, {"stopped_at": list(guard.stopped_at), "signal": guard.guard.received},
                 prefix="preempted")
    raise
