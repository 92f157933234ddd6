# What the README's Keras diff leaves out: imports, data (the bundled digits, offline), the model.
import keras
from keras.callbacks import ModelCheckpoint  # noqa: F401 (the diff uses it)

from hvdkit.examples.datasets import load_dataset

data = load_dataset("digits")
x_train, y_train = data.x_train.reshape(-1, 784), data.y_train


def make_model():
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])
