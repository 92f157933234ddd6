"""Worker: Horovod's own TensorFlow/Keras API on today's Keras, as hvdkit's patch fixes it.

--task local_source (Keras 3 on TF): PartialDistributedGradientTape with a
  local layer; Keras 3 variables used to fail with "'Variable' object has no
  attribute 'ref'". Shared gradients must be the mean over ranks, the local
  layer's its own gradient divided by size (scale_local_gradients).
--task warmup_callback (tf-keras): hvd.callbacks.LearningRateWarmupCallback in
  model.fit; it used to reach Keras 3's backend ("no attribute 'get_value'").
"""

import argparse

import numpy as np
from keras_common import parse_args
from rank_results import write_result

from hvdkit.keras.mode import use_backend

p = argparse.ArgumentParser()
p.add_argument("--task", choices=["local_source", "warmup_callback"], required=True)
args = parse_args(p)
keras = use_backend(args.mode)   # before horovod.tensorflow, whose SyncBatchNormalization imports tf.keras

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

hvd.init()
result = {"size": hvd.size(), "keras": keras.__version__}


def local_source():
    keras.utils.set_random_seed(3)
    shared, local = keras.layers.Dense(4, name="shared"), keras.layers.Dense(2, name="local")
    model = keras.Sequential([keras.Input((5,)), shared, local])
    x = tf.constant(np.random.default_rng(hvd.rank()).standard_normal((8, 5)), tf.float32)

    def loss_fn():
        return tf.reduce_mean(model(x) ** 2)

    with tf.GradientTape() as plain:
        loss = loss_fn()
    own = [g.numpy() for g in plain.gradient(loss, model.trainable_weights)]
    with tf.GradientTape() as tape:
        loss = loss_fn()
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local])
    grads = [g.numpy() for g in tape.gradient(loss, model.trainable_weights)]
    every = hvd.allgather_object(own, name="own")
    n_shared = len(shared.trainable_weights)
    mean = [np.mean([r[i] for r in every], axis=0) for i in range(len(own))]
    result["shared_diff"] = max(float(np.max(np.abs(grads[i] - mean[i]))) for i in range(n_shared))
    result["local_diff"] = max(float(np.max(np.abs(grads[i] - own[i] / hvd.size())))
                               for i in range(n_shared, len(own)))
    result["ranks_differ"] = max(float(np.max(np.abs(every[0][i] - every[1][i]))) for i in range(len(own)))


def warmup_callback():
    import horovod.tensorflow.keras as hvd_keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
    base_lr, steps = 0.1, 4
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(learning_rate=base_lr))
    model.compile(optimizer=opt, loss="mse")
    lrs = []

    class RecordLR(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            lrs.append(float(keras.backend.get_value(self.model.optimizer.lr)))

    rng = np.random.default_rng(hvd.rank())
    x, y = rng.standard_normal((steps * 4, 5)), rng.standard_normal((steps * 4, 2))
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[
        hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd_keras.callbacks.LearningRateWarmupCallback(initial_lr=base_lr, warmup_epochs=1, steps_per_epoch=steps),
        RecordLR(),
    ])
    result.update(lrs=lrs, base_lr=base_lr, steps=steps)


{"local_source": local_source, "warmup_callback": warmup_callback}[args.task]()
write_result(args.out, hvd.rank(), result)
