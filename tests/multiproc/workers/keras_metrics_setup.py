"""The data, model and metrics that the Keras metrics workers and their one-process reference share.

A binary classifier with counts (TruePositives, FalseNegatives), ratios (Precision, Recall, AUC, accuracy) and
the loss, on 203 training rows and 101 validation rows: neither divides by 2 or 3, so a padding row counted
twice, or a count divided by the ranks, shows.
"""

import numpy as np

N_TRAIN, N_VAL = 203, 101


def data():
    """x_train, y_train, x_val, y_val: the same on every rank and in every process."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N_TRAIN + N_VAL, 8)).astype("float32")
    y = (x @ rng.standard_normal(8) + 0.5 * rng.standard_normal(N_TRAIN + N_VAL) > 0).astype("float32")[:, None]
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


def metrics(keras):
    return [keras.metrics.TruePositives(name="tp"), keras.metrics.FalseNegatives(name="fn"),
            keras.metrics.Precision(name="precision"), keras.metrics.Recall(name="recall"),
            keras.metrics.AUC(name="auc"), keras.metrics.BinaryAccuracy(name="accuracy")]


def build(keras):
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                             keras.layers.Dense(1, activation="sigmoid")])


def validate(hk, model, val, metric_list, batch_size: int = 16) -> dict[str, float]:
    """A custom validation loop over this rank's unpadded shard: fresh metrics, hk.sync_metrics, the results."""
    for start in range(0, len(val[0]), batch_size):
        xb, yb = val[0][start:start + batch_size], val[1][start:start + batch_size]
        predictions = model.predict_on_batch(xb)
        for m in metric_list:
            m.update_state(yb, predictions)
    hk.sync_metrics(*metric_list)                   # the state summed over the ranks, then the results
    return {m.name: float(m.result()) for m in metric_list}
