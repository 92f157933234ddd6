"""Train the Keras MNIST convnet data-parallel with hvdkit + Horovod.

    horovodrun -np 2 -H localhost:2 python examples/keras_mnist.py                      # Keras 3 on TensorFlow
    horovodrun -np 2 -H localhost:2 python examples/keras_mnist.py --backend torch      # Keras 3 on PyTorch
    horovodrun -np 2 -H localhost:2 python examples/keras_mnist.py --backend tf_keras   # legacy tf-keras

With --checkpoint-dir DIR, SIGTERM or SIGUSR1 to any rank (a cluster's preemption notice) checkpoints
every rank at the next batch into DIR and exits 75; --resume continues from there, on any number of processes.

Every line that differs from the single-process script is marked `# hvdkit:`.
"""

import argparse
import json
import os
import time

import hvdkit.keras as hk  # hvdkit:
from hvdkit.argtypes import non_negative_float, positive_float, positive_int
from hvdkit.examples.datasets import DATASETS, DatasetError, load_dataset


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["tensorflow", "torch", "tf_keras"],
                   help="default: KERAS_BACKEND, else ~/.keras/keras.json, else TensorFlow if installed, else torch")
    p.add_argument("--dataset", choices=DATASETS, default="digits")
    p.add_argument("--data-dir", default="data/mnist", help="where the MNIST IDX files are (or go)")
    p.add_argument("--epochs", type=positive_int, default=12)
    p.add_argument("--batch-size", type=positive_int, default=32,
                   help="per process (with --global-batch: the micro-batch)")
    p.add_argument("--global-batch", type=positive_int, metavar="N",
                   help="the same N samples a step at any number of processes (docs/GLOBAL_BATCH.md): the model a "
                        "resumed or resized job ends with does not depend on them; --lr is then N's own rate")
    p.add_argument("--lr", type=positive_float, default=0.001, help="single-process learning rate")
    p.add_argument("--warmup-epochs", type=non_negative_float,
                   help="ramp the rate up from lr over this many epochs (default 2; not with --global-batch)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--compression", choices=["none", "fp16", "bf16"], default="none",
                   help="send gradients as float16 or bfloat16 (half the bytes)")
    p.add_argument("--shard-optimizer-state", action="store_true",
                   help="keep 1/N of the optimizer state on each process (ZeRO stage 1)")
    p.add_argument("--checkpoint", metavar="FILE", default=None, help="save here after training (.npz)")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="on SIGTERM/SIGUSR1 to any rank: checkpoint mid-epoch as DIR/ckpt-<step>.npz, exit 75")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --checkpoint-dir (from scratch while there is none, "
                        "so a requeued job can always pass it)")
    p.add_argument("--json", action="store_true", help="print the final metrics as JSON")
    args = p.parse_args()
    if args.global_batch and args.warmup_epochs is not None:
        p.error("--warmup-epochs ramps from lr/processes, and --global-batch keeps one rate at any number of "
                "processes: leave --warmup-epochs out")
    if args.warmup_epochs is None:
        args.warmup_epochs = 0 if args.global_batch else 2
    return args


def build_model(keras):
    # No BatchNormalization in this model. In a model with it, use
    # hk.SyncBatchNormalization() in its place to normalise over every rank's batch
    # (same arguments; plain BatchNormalization keeps per-rank statistics).
    return keras.Sequential([  # keras.io's "Simple MNIST convnet"
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(10, activation="softmax"),
    ])


def main():
    args = parse_args()
    # Data before Keras: a bad --dataset or --data-dir fails in a second, before TensorFlow's start-up logs.
    try:
        data = load_dataset(args.dataset, args.data_dir, seed=args.seed)
    except DatasetError as exc:
        raise SystemExit(f"error: {exc}") from None
    keras = hk.use_backend(args.backend)  # Keras reads its backend once, at import: choose it first
    ctx = hk.init(seed=args.seed)  # hvdkit: Horovod init, device per local rank, one seed for all
    if args.global_batch:  # hvdkit: steps of the same samples at any -np, split into micro-batches
        batches = hk.global_batches(data.x_train[..., None], data.y_train, global_batch=args.global_batch,
                                    micro_batch=args.batch_size, seed=args.seed)
    else:  # hvdkit: each rank its 1/size of every epoch's shuffle, resumable mid-epoch on any number of ranks
        batches = hk.distributed_batches(data.x_train[..., None], data.y_train, args.batch_size, seed=args.seed)

    model = build_model(keras)
    lr = args.lr if args.global_batch else hk.scale_lr(args.lr)  # hvdkit: lr x size, unless the batch is fixed
    optimizer = hk.DistributedOptimizer(keras.optimizers.Adam(lr),  # hvdkit: gradients averaged (or summed by share)
                                        compression=args.compression,
                                        shard_optimizer_state=args.shard_optimizer_state,
                                        global_batch=batches if args.global_batch else None)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    checkpoint_dir = os.path.join(args.checkpoint_dir, "") if args.checkpoint_dir else None  # '/': a directory
    if args.resume and checkpoint_dir:
        try:  # hvdkit: rank 0 reads the newest good checkpoint, all load; on another -np the rate is rescaled
            batches.resume(hk.load_checkpoint(checkpoint_dir, model, optimizer, missing_ok=True))  # hvdkit:
        except hk.CheckpointError as exc:
            raise SystemExit(f"error: {exc}") from None
    start = time.time()
    hk.fit(model, batches, epochs=args.epochs,  # hvdkit: model.fit from batches.epoch, a resumed epoch's rest first
           verbose=ctx.verbose,  # hvdkit: a line per epoch from rank 0 only
           callbacks=hk.callbacks(warmup_epochs=args.warmup_epochs,  # hvdkit: broadcast, exact metrics, warmup
                                  preemption_checkpoint=checkpoint_dir))  # hvdkit: SIGTERM -> checkpoint, exit 75
    elapsed = time.time() - start
    # Every rank holds the same weights, so evaluating the whole (small) test set gives every rank the exact result.
    loss, accuracy = model.evaluate(data.x_test[..., None], data.y_test, verbose=0)
    if args.checkpoint:
        hk.save_checkpoint(args.checkpoint, model, optimizer, epoch=args.epochs - 1)  # hvdkit: rank 0 writes
    if ctx.is_main:  # hvdkit:
        print(f"final test accuracy {accuracy:.2%} ({len(data.y_test)} samples) in {elapsed:.1f}s "
              f"on {ctx.size} processes")
        if args.json:
            print(json.dumps({"dataset": args.dataset, "backend": hk.resolve_backend(), "size": ctx.size,
                              "epochs": args.epochs, "compression": args.compression,
                              "test_accuracy": float(accuracy), "test_loss": float(loss),
                              "seconds": round(elapsed, 2)}))


if __name__ == "__main__":
    main()
