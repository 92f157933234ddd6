"""Worker: a Keras checkpoint taken mid-epoch by the preemption callback on one world size, resumed on another
(issue 34, case 3, for Keras).

The model is one Dense unit over one-hot rows, kernel zero, loss the batch mean of its output, plain SGD at
scale_lr(0.1): a row's weight falls by exactly 0.01 each time its sample is trained on, whatever the world
size (the averaged gradient is 1/(B*size) a sample, the rate 0.1*size). After epoch 0 every weight is -0.01
when each of its 600 samples was seen once; a skipped sample leaves 0, a repeated one -0.02.

--phase first: rank 1 signals itself before batch 14; the checkpoint callback stops every rank after it (15
  batches of 10 on 2 ranks: 300 samples) and exits 75.
--phase resume: load on however many ranks this job has and finish epoch 0 with hk.fit.
--phase misuse: the ways model.fit could lose the position, each must raise naming hk.fit; and
  model.fit(batches, shuffle=False) over 2 epochs draws a new order in epoch 1, with hk.callbacks and without.
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
p.add_argument("--phase", choices=["first", "resume", "misuse"], required=True)
p.add_argument("--warmup", action="store_true", help="warm up over 2 epochs; resume trains 3 and reports the rate")
args = parse_args(p)

keras = hk.use_backend(args.mode)
ctx = hk.init(seed=1, threads=1)
N, B = 600, 10
x = np.eye(N, dtype="float32")
batches = hk.distributed_batches(x, np.zeros((N, 1), "float32"), B, seed=3)
model = keras.Sequential([keras.Input((N,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(hk.scale_lr(0.1))),
              loss=lambda y_true, y_pred: keras.ops.mean(y_pred))
result = {"size": ctx.size, "rank": ctx.rank}


class SignalRank1(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == 14 and ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)


if args.phase == "misuse":
    errors = []
    for case in ("shuffled", "resumed_several_epochs"):
        if case == "resumed_several_epochs":
            batches.set_epoch(0, start_sample=300)
        try:
            model.fit(batches, epochs=2, verbose=0, shuffle=case == "shuffled", callbacks=hk.callbacks())
            errors.append(None)
        except hk.UserError as exc:
            errors.append(str(exc))
    batches.set_epoch(0)

    class RecordOrder(keras.callbacks.Callback):
        def __init__(self, orders):
            super().__init__()
            self.orders = orders

        def on_epoch_begin(self, epoch, logs=None):
            self.orders.append(batches._rows[:20].tolist())     # after hk.callbacks' own on_epoch_begin

    orders, plain = [], []
    model.fit(batches, epochs=2, verbose=0, shuffle=False, callbacks=hk.callbacks(RecordOrder(orders)))
    epochs = [batches.epoch]
    # The same without hk.callbacks: Keras's own on_epoch_end must move the batches on.
    batches.set_epoch(0)
    model.fit(batches, epochs=2, verbose=0, shuffle=False, callbacks=[RecordOrder(plain)])
    write_result(args.out, ctx.rank, {**result, "errors": errors, "epochs": epochs + [batches.epoch], "orders": orders,
                                      "plain_orders": plain})
elif args.phase == "resume":
    extra = hk.load_checkpoint(args.ckpt, model, model.optimizer)
    batches.resume(extra)
    result.update(lr=float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)), samples=extra["samples"],
                  start=[batches.epoch, batches.start_sample], batches=len(batches))
    if args.warmup:      # resumed inside the warmup: it must still ramp to scale_lr(0.1) for this size
        hk.fit(model, batches, epochs=3, verbose=0, callbacks=hk.callbacks(warmup_epochs=2))
        result["final_lr"] = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
        write_result(args.out, ctx.rank, result)
        raise SystemExit(0)
    hk.fit(model, batches, epochs=1, verbose=0, callbacks=hk.callbacks())
    result["kernel"] = keras.ops.convert_to_numpy(model.layers[0].kernel).ravel().tolist()
    write_result(args.out, ctx.rank, result)
else:
    try:
        hk.fit(model, batches, epochs=1, verbose=0, callbacks=hk.callbacks(
            SignalRank1(), preemption_checkpoint=args.ckpt, warmup_epochs=2 if args.warmup else None))
    finally:
        write_result(args.out, ctx.rank, result)
