"""What hk.callbacks()'s per-batch NaN/inf loss check costs in fit (docs/RELIABILITY.md): run on 2 ranks.

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python docs/bench/check_costs_keras.py

The classic Keras MNIST convnet (examples/keras_mnist.py's model until stop 68) on the bundled digits, Keras 3 on TensorFlow, batch 32:
the median batch time with check_finite on and off, interleaved epochs.
"""

import platform
import statistics
import time

import hvdkit.keras as hk
from hvdkit.examples.datasets import load_dataset

keras = hk.use_backend("tensorflow")
ctx = hk.init(seed=0)
data = load_dataset("digits", "data/mnist", seed=0)
x, y = hk.shard_arrays(data.x_train[..., None], data.y_train)


def build():
    return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(32, 3, activation="relu"),
                             keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(2),
                             keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])


class BatchTimes(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self.start)


on, off = [], []
for _ in range(3):
    for check, into in ((False, off), (True, on)):
        model = build()
        model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.Adam(1e-3)),
                      loss="sparse_categorical_crossentropy")
        timer = BatchTimes()
        # The timer goes last, so a batch's time includes the check that runs at its end.
        model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[*hk.callbacks(check_finite=check), timer])
        into += timer.times[5:]
if ctx.rank == 0:
    m_on, m_off = statistics.median(on), statistics.median(off)
    print(f"{platform.processor() or platform.machine()}, {ctx.size} ranks, keras {keras.__version__} on TensorFlow")
    print(f"keras convnet batch median: check_finite=False {1e3 * m_off:.2f} ms, True {1e3 * m_on:.2f} ms "
          f"({100 * (m_on / m_off - 1):+.1f}%), {len(on)} batches each")
