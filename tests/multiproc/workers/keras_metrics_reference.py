"""One process, no Horovod and no hvdkit: the whole validation set evaluated with the weights a multi-rank job
saved, as a user would check a distributed run's numbers. Prints the metrics as one JSON line.

    python keras_metrics_reference.py --mode torch --weights final.weights.h5
"""

import argparse
import json
import os

from keras_metrics_setup import build, data, metrics

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["tensorflow", "torch", "tf_keras"], required=True)
p.add_argument("--weights", required=True)
args = p.parse_args()
if args.mode == "tf_keras":
    import tf_keras as keras
else:
    os.environ["KERAS_BACKEND"] = args.mode
    import keras

_, _, x_val, y_val = data()
model = build(keras)
model.load_weights(args.weights)
model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=metrics(keras))
result = model.evaluate(x_val, y_val, batch_size=16, verbose=0, return_dict=True)
print(json.dumps({name: float(value) for name, value in result.items()}))
