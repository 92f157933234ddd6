"""Worker: fit's logged metrics on N ranks against one process over the whole data (issue 54, cases 2 and 8).

A binary classifier with counts (TruePositives, FalseNegatives), ratios (Precision, Recall, AUC, accuracy) and
the loss, trained 2 epochs on 203 rows with 101 validation rows: neither divides by 2 or 3, so a padding row
counted twice would show. Each rank records its own metric state when fit's validation starts (a callback
before hvdkit's). Rank 0 then evaluates the whole validation set alone, with the final weights, as one process
would. Written per rank:

- ``logged``: the last epoch's logs; ``train_expected``: each rank's recorded training state gathered, summed
  and turned into results on rank 0;
- ``evaluated``: ``hk.evaluate`` of this rank's unpadded shard;
- ``custom``: a custom validation loop over the shard with fresh metrics and ``hk.sync_metrics``;
- ``reference`` (rank 0): ``model.evaluate`` of the whole validation set in this process alone.
"""

import argparse

import numpy as np
from keras_common import parse_args
from rank_results import write_result

import hvdkit.keras as hk

p = argparse.ArgumentParser()
args = parse_args(p)

keras = hk.use_backend(args.mode)
ctx = hk.init(seed=0, threads=1)
rng = np.random.default_rng(0)
N_TRAIN, N_VAL = 203, 101
x = rng.standard_normal((N_TRAIN + N_VAL, 8)).astype("float32")
y = (x @ rng.standard_normal(8) + 0.5 * rng.standard_normal(N_TRAIN + N_VAL) > 0).astype("float32")[:, None]
x_train, y_train, x_val, y_val = x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


def metrics():
    return [keras.metrics.TruePositives(name="tp"), keras.metrics.FalseNegatives(name="fn"),
            keras.metrics.Precision(name="precision"), keras.metrics.Recall(name="recall"),
            keras.metrics.AUC(name="auc"), keras.metrics.BinaryAccuracy(name="accuracy")]


def state_of(metric_list):
    return [np.asarray(keras.ops.convert_to_numpy(v), dtype=np.float64).tolist()
            for v in hk_metric_variables(metric_list)]


def hk_metric_variables(metric_list):
    from hvdkit.keras.metrics import metric_variables

    return metric_variables(metric_list)


model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(hk.scale_lr(0.05))),
              loss="binary_crossentropy", metrics=metrics())
recorded = {}


class RecordLocalState(keras.callbacks.Callback):
    """Before hvdkit's callbacks: this rank's own training state, as fit's validation starts."""

    def on_test_begin(self, logs=None):
        recorded["train"] = state_of(self.model.metrics)


xs, ys = hk.shard_arrays(x_train, y_train)
val = hk.shard_arrays(x_val, y_val, pad=False)
history = model.fit(xs, ys, batch_size=16, epochs=2, shuffle=False, verbose=0, validation_data=val,
                    callbacks=[RecordLocalState(), *hk.callbacks()])
logged = {k: v[-1] for k, v in history.history.items()}

# Independently of hvdkit's sum: every rank's recorded state, summed on rank 0, put into the model's metrics.
gathered = hk.hvd.allgather_object(recorded["train"])
train_expected = None
if ctx.rank == 0:
    for variable, *per_rank in zip(hk_metric_variables(model.metrics), *gathered):
        total = np.sum([np.asarray(s) for s in per_rank], axis=0)
        variable.assign(total.reshape(np.shape(keras.ops.convert_to_numpy(variable))).astype(variable.dtype))
    train_expected = {k: float(v) for k, v in model.get_metrics_result().items()}

evaluated = hk.evaluate(model, *val, batch_size=16, verbose=0, return_dict=True)

custom_metrics = metrics()
for start in range(0, len(val[0]), 16):
    xb, yb = val[0][start:start + 16], val[1][start:start + 16]
    for m in custom_metrics:
        m.update_state(yb, model(xb, training=False))
hk.sync_metrics(*custom_metrics)
custom = {m.name: float(m.result()) for m in custom_metrics}

result = {"rank": ctx.rank, "size": ctx.size, "rows": len(val[0]), "logged": logged,
          "train_expected": train_expected, "evaluated": {k: float(v) for k, v in evaluated.items()},
          "custom": custom}
if ctx.rank == 0:
    result["reference"] = {k: float(v) for k, v in
                           model.evaluate(x_val, y_val, batch_size=16, verbose=0, return_dict=True).items()}
write_result(args.out, ctx.rank, result)
