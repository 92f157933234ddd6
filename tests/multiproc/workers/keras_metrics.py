"""Worker: fit's logged metrics on N ranks against one process over the whole data (issue 54, cases 2 and 8).

The model, data and metrics are keras_metrics_setup's. Each rank records its own metric state when fit's
validation starts (a callback before hvdkit's). A ModelCheckpoint, one of fit's callbacks, saves the final
weights on rank 0 (--weights); the test evaluates them in a process of its own (keras_metrics_reference.py).
Written per rank:

- ``logged``: the last epoch's logs; ``train_expected``: each rank's recorded training state gathered, summed
  and turned into results on rank 0;
- ``evaluated``: ``hk.evaluate`` of this rank's unpadded shard;
- ``custom``: a custom validation loop over the shard with fresh metrics and ``hk.sync_metrics``.
"""

import argparse

import numpy as np
from keras_common import parse_args
from keras_metrics_setup import build, data, metrics, validate
from rank_results import write_result

import hvdkit.keras as hk
from hvdkit.keras.metrics import metric_variables

p = argparse.ArgumentParser()
p.add_argument("--weights", required=True)
args = parse_args(p)

keras = hk.use_backend(args.mode)
ctx = hk.init(seed=0, threads=1)
x_train, y_train, x_val, y_val = data()


def state_of(metric_list):
    return [np.asarray(keras.ops.convert_to_numpy(v), dtype=np.float64).tolist() for v in metric_variables(metric_list)]


model = build(keras)
model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(hk.scale_lr(0.05))),
              loss="binary_crossentropy", metrics=metrics(keras))
recorded = {}


class RecordLocalState(keras.callbacks.Callback):
    """Before hvdkit's callbacks: this rank's own training state, as fit's validation starts."""

    def on_test_begin(self, logs=None):
        recorded["train"] = state_of(self.model.metrics)


xs, ys = hk.shard_arrays(x_train, y_train)
val = hk.shard_arrays(x_val, y_val, pad=False)
saver = keras.callbacks.ModelCheckpoint(args.weights, save_weights_only=True)     # hk.callbacks: rank 0 only
history = model.fit(xs, ys, batch_size=16, epochs=2, shuffle=False, verbose=0, validation_data=val,
                    callbacks=[RecordLocalState(), *hk.callbacks(saver)])
logged = {k: v[-1] for k, v in history.history.items()}

# Independently of hvdkit's sum: every rank's recorded state, summed on rank 0, put into the model's metrics.
gathered = hk.hvd.allgather_object(recorded["train"])
train_expected = None
if ctx.rank == 0:
    for variable, *per_rank in zip(metric_variables(model.metrics), *gathered):
        total = np.sum([np.asarray(s) for s in per_rank], axis=0)
        variable.assign(total.reshape(np.shape(keras.ops.convert_to_numpy(variable))).astype(variable.dtype))
    train_expected = {k: float(v) for k, v in model.get_metrics_result().items()}

evaluated = hk.evaluate(model, *val, batch_size=16, verbose=0, return_dict=True)

custom = validate(hk, model, val, metrics(keras))

write_result(args.out, ctx.rank, {"rank": ctx.rank, "size": ctx.size, "rows": len(val[0]), "logged": logged,
                                  "train_expected": train_expected, "custom": custom,
                                  "evaluated": {k: float(v) for k, v in evaluated.items()}})
