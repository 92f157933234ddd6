"""Worker: a .keras file written under hvdkit (ModelCheckpoint in hk.callbacks), read right after fit on every rank.

The checkpoint callback is the user's own subclass that takes 2 s before writing, as a large model's save
does: rank 1 must not return from fit, and read the file, before rank 0 has written it (issue 34, case 7).
"""

import argparse
import os
import time

import numpy as np
from keras_common import parse_args
from rank_results import write_result

import hvdkit.keras as hk

p = argparse.ArgumentParser()
p.add_argument("--path", required=True)
args = parse_args(p)

keras = hk.use_backend(args.mode)
ctx = hk.init(seed=0, threads=1)


class SlowCheckpoint(keras.callbacks.ModelCheckpoint):
    """A user's subclass: hk.callbacks must still keep it on rank 0 only."""

    def _save_model(self, *a, **k):
        time.sleep(2)
        return super()._save_model(*a, **k)


rng = np.random.default_rng(0)
x, y = hk.shard_arrays(rng.standard_normal((128, 6)).astype("float32"), rng.integers(0, 3, 128))
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.Adam(hk.scale_lr(1e-3))),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
cbs = hk.callbacks(SlowCheckpoint(args.path))
model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=cbs)
result = {"size": ctx.size, "callbacks": [type(cb).__name__ for cb in cbs], "error": None}
try:
    loaded = keras.models.load_model(args.path)          # every rank, right after fit
    result["same_weights"] = all(np.array_equal(a, b) for a, b in zip(loaded.get_weights(), model.get_weights()))
except Exception as exc:  # noqa: BLE001 - the test reads the type and message
    result["error"] = f"{type(exc).__name__}: {exc}"
result["exists_after_fit"] = os.path.exists(args.path)
write_result(args.out, ctx.rank, result)
