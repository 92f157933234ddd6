"""Worker: Horovod's own Keras recipe, unchanged, as a user arriving from Horovod's docs writes it.

Keras 3 (the default of TensorFlow 2.21) must stop at the first Horovod call with one line naming the
two ways out; with TF_USE_LEGACY_KERAS=1 (tf-keras) the same script trains.
"""

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

hvd.init()
rng = np.random.default_rng(hvd.rank())
x = rng.standard_normal((64, 8)).astype("float32")
y = (x[:, 0] > 0).astype("int64")
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(2)])
opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01 * hvd.size()))
model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=opt,
              metrics=["accuracy"], experimental_run_tf_function=False)
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
             hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.01 * hvd.size(), warmup_epochs=1, verbose=0)]
model.fit(x, y, batch_size=8, epochs=2, callbacks=callbacks, verbose=0)
print(f"trained on {hvd.size()} ranks")
