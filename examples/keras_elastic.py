"""Elastic Keras training: keeps going when workers are lost, added or removed.

    horovodrun -np 2 --min-np 1 --max-np 4 --network-interface lo \\
        --host-discovery-script examples/discover_hosts.sh python examples/keras_elastic.py --backend torch

Rank 0 prints one line per commit ("committed step N ... size S"). Every line
that differs from the single-process script is marked `# hvdkit:`.
"""

import argparse
import json
import time

import hvdkit.keras as hk  # hvdkit:
from hvdkit.argtypes import positive_float, positive_int
from hvdkit.examples.datasets import DATASETS, DatasetError, load_dataset


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["tensorflow", "torch", "tf_keras"],
                   help="default: KERAS_BACKEND, else ~/.keras/keras.json, else TensorFlow if installed, else torch")
    p.add_argument("--dataset", choices=DATASETS, default="digits")
    p.add_argument("--data-dir", default="data/mnist", help="where the MNIST IDX files are (or go)")
    p.add_argument("--epochs", type=positive_int, default=10)
    p.add_argument("--batch-size", type=positive_int, default=16, help="per process")
    p.add_argument("--lr", type=positive_float, default=0.01, help="single-process learning rate")
    p.add_argument("--commit-every", type=positive_int, default=1, help="batches between commits")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", action="store_true", help="print the final metrics as JSON")
    return p.parse_args()


def main():
    args = parse_args()
    try:
        data = load_dataset(args.dataset, args.data_dir, seed=args.seed)
    except DatasetError as exc:
        raise SystemExit(f"error: {exc}") from None
    keras = hk.use_backend(args.backend)  # Keras reads its backend once, at import: choose it first
    hk.init(seed=args.seed)  # hvdkit:
    x_train, y_train = data.x_train.reshape(len(data.x_train), -1), data.y_train

    model = keras.Sequential([keras.Input((28 * 28,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    optimizer = hk.DistributedOptimizer(keras.optimizers.SGD(hk.scale_lr(args.lr), momentum=0.9))  # hvdkit:
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    # hvdkit: what a commit holds; its first sync gives every rank rank 0's weights
    state = hk.elastic.ElasticState(model, optimizer, base_lr=args.lr, commit_every=args.commit_every,
                                    seed=args.seed)

    def log_commit(s):  # hvdkit: rank 0 reports each commit
        if hk.current().is_main:
            print(f"committed step {s.step} epoch {s.epoch} size {hk.current().size}", flush=True)

    state.register_commit_callbacks([log_commit])  # hvdkit:

    @hk.elastic.run  # hvdkit: on a lost worker or a host change, restore the last commit and carry on
    def train(state):
        while state.epoch < args.epochs:
            xs, ys = state.shard(x_train, y_train)  # hvdkit: the rest of this epoch, this rank's part
            model.fit(xs, ys, batch_size=args.batch_size, epochs=1, shuffle=False, verbose=0,
                      callbacks=[state.callback(args.batch_size)])  # hvdkit: count and commit every batch
            state.epoch_done()  # hvdkit:

    start = time.time()
    train(state)
    loss, accuracy = model.evaluate(data.x_test.reshape(len(data.x_test), -1), data.y_test, verbose=0)
    if hk.current().is_main:  # hvdkit:
        print(f"final test accuracy {accuracy:.2%} after {state.step} steps, {time.time() - start:.1f}s", flush=True)
        if args.json:
            print(json.dumps({"test_accuracy": float(accuracy), "steps": state.step, "size": hk.current().size,
                              "epochs": state.epoch, "backend": hk.resolve_backend()}), flush=True)


if __name__ == "__main__":
    main()
