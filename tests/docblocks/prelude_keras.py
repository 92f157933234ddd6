# What the README's Keras diff leaves out: imports, data (the bundled digits, offline), the model.
import keras
from keras.callbacks import ModelCheckpoint  # noqa: F401 (the diff uses it)

from hvdkit.examples.datasets import load_dataset

data = load_dataset("digits")
# The first 480 digits: the diff runs its 12 epochs as written, and what the test checks is that both sides
# run (exit 0, 2 ranks, no hvdkit: warning), not their accuracy.
x_train, y_train = data.x_train[:480].reshape(-1, 784), data.y_train[:480]


def make_model():
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])
