"""Train the classic MNIST convnet data-parallel with hvdkit + Horovod.

    horovodrun -np 2 -H localhost:2 python examples/pytorch_mnist.py                   # digits, offline
    horovodrun -np 4 -H server1:2,server2:2 python examples/pytorch_mnist.py --dataset mnist --data-dir /data/mnist
    python examples/pytorch_mnist.py --epochs 1                                         # 1 process works too

Every line that differs from the single-process script is marked `# hvdkit:`.
"""

import argparse
import json
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import hvdkit.torch as hk  # hvdkit:
from hvdkit.argtypes import non_negative_float, positive_float, positive_int
from hvdkit.examples.datasets import DATASETS, DatasetError, load_dataset


class Net(nn.Module):
    """conv 1->32 k3, conv 32->64 k3 + Dropout2d, fc 64*5*5->500, fc 500->10."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.conv2_drop = nn.Dropout2d(0.25)
        self.fc1 = nn.Linear(64 * 5 * 5, 500)
        self.fc2 = nn.Linear(500, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)                    # 28 -> 26 -> 13
        x = F.max_pool2d(F.relu(self.conv2_drop(self.conv2(x))), 2)    # 13 -> 11 -> 5
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=DATASETS, default="digits")
    p.add_argument("--data-dir", default="data/mnist", help="where the MNIST IDX files are (or go)")
    p.add_argument("--epochs", type=positive_int, default=12)
    p.add_argument("--batch-size", type=positive_int, default=32,
                   help="per process (with --global-batch: the micro-batch)")
    p.add_argument("--global-batch", type=positive_int, metavar="N",
                   help="the same N samples a step at any number of processes (docs/GLOBAL_BATCH.md): the model a "
                        "resumed or resized job ends with does not depend on them; --lr is then N's own rate")
    p.add_argument("--lr", type=positive_float, default=0.01, help="single-process learning rate")
    p.add_argument("--warmup-epochs", type=non_negative_float,
                   help="ramp the rate up from lr over this many epochs (default 2; not with --global-batch)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--compression", choices=["none", "fp16", "bf16"], default="none",
                   help="send gradients as float16 or bfloat16 (half the bytes)")
    p.add_argument("--shard-optimizer-state", action="store_true",
                   help="keep 1/N of the optimizer state on each process (ZeRO stage 1)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--checkpoint", metavar="FILE", help="save after every epoch into this one file")
    where.add_argument("--checkpoint-dir", metavar="DIR",
                       help="save after every epoch as DIR/ckpt-<step>.pt, keeping the newest 3")
    p.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint (in --checkpoint-dir: the newest good one, or from scratch "
                        "while there is none yet, so a requeued job can always pass it)")
    p.add_argument("--json", action="store_true", help="print the final metrics as JSON")
    args = p.parse_args()
    if args.global_batch and args.warmup_epochs is not None:
        p.error("--warmup-epochs ramps from lr/processes, and --global-batch keeps one rate at any number of "
                "processes: leave --warmup-epochs out")
    if args.warmup_epochs is None:
        args.warmup_epochs = 2
    return args


def save(path, numbered, model, optimizer, scheduler, epoch, samples, epoch_size):
    """Checkpoint once ``samples`` of ``epoch``'s samples were trained on (all ranks together)."""
    # ckpt-<samples since the start>.pt, the newest 3: the name grows whatever the number of processes
    steps = dict(step=epoch * epoch_size + samples, keep_last=3) if numbered else {}
    try:
        # The random generator's state too (dropout): every rank has the same one (init's seed is the
        # same everywhere), so a resumed run draws what the uninterrupted one would have.
        hk.save_checkpoint(path, model, optimizer, **steps, scheduler=scheduler,  # hvdkit: rank 0 writes
                           epoch=epoch, samples=samples, rng=torch.get_rng_state())
    except hk.CheckpointError as exc:  # e.g. the disk filled up: one line, the previous checkpoint kept
        raise SystemExit(f"error: {exc}") from None


def main():
    args = parse_args()
    # A path ending in '/' is a checkpoint directory to hvdkit, even before it exists.
    checkpoint = os.path.join(args.checkpoint_dir, "") if args.checkpoint_dir else args.checkpoint
    ctx = hk.init(seed=args.seed)  # hvdkit: Horovod init, device per local rank, one seed for all
    log = hk.get_logger(ctx.rank, ctx.size)  # hvdkit:
    try:
        data = load_dataset(args.dataset, args.data_dir, seed=args.seed)
    except DatasetError as exc:
        raise SystemExit(f"error: {exc}") from None
    train_set = TensorDataset(torch.from_numpy(data.x_train).unsqueeze(1), torch.from_numpy(data.y_train))
    test_set = TensorDataset(torch.from_numpy(data.x_test).unsqueeze(1), torch.from_numpy(data.y_test))
    if args.global_batch:  # hvdkit: steps of the same samples at any -np, split into micro-batches
        train_loader = hk.global_batch_loader(train_set, args.global_batch, args.batch_size, seed=args.seed)
    else:
        train_loader = hk.distributed_loader(train_set, args.batch_size, shuffle=True, seed=args.seed)  # hvdkit: shard
    test_loader = hk.eval_loader(test_set, batch_size=256)  # hvdkit: unpadded shard for exact accuracy
    per_epoch = len(train_loader)

    model = Net().to(ctx.device)
    lr = args.lr if args.global_batch else hk.scale_lr(args.lr)  # hvdkit: lr x size, unless the batch is fixed
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    optimizer = hk.DistributedOptimizer(optimizer, model, compression=args.compression,  # hvdkit: average gradients
                                        shard_optimizer_state=args.shard_optimizer_state,
                                        global_batch=train_loader if args.global_batch else None)
    # hvdkit: from rate/size up to the scaled rate over the first epochs (a fixed global batch keeps one rate)
    scheduler = None if args.global_batch else hk.warmup_scheduler(optimizer, warmup_epochs=args.warmup_epochs,
                                                                   steps_per_epoch=per_epoch)
    start_epoch, start_sample, extra = 0, 0, None
    if checkpoint:
        try:  # hvdkit: a read-only or full checkpoint directory stops the job now, not after an epoch
            hk.check_checkpoint_path(checkpoint, model, optimizer, keep_last=3 if args.checkpoint_dir else None)
        except hk.CheckpointError as exc:
            raise SystemExit(f"error: {exc}") from None
    if args.resume and checkpoint:
        try:  # hvdkit: rank 0 reads, all load; on another -np the rates are rescaled as scale_lr would
            # In a directory, nothing there yet (a requeued job's first run) starts from scratch; a named
            # file that does not exist is a mistake.
            extra = hk.load_checkpoint(checkpoint, model, optimizer, scheduler=scheduler,
                                       missing_ok=bool(args.checkpoint_dir))
        except hk.CheckpointError as exc:
            raise SystemExit(f"error: {exc}") from None
    if extra is not None:
        # Saved at an epoch's end, or mid-epoch when the job was preempted.
        start_epoch, start_sample = extra["epoch"], extra["samples"]
        torch.set_rng_state(extra["rng"])
        if start_sample >= len(train_set):
            start_epoch, start_sample = start_epoch + 1, 0
    else:
        if args.resume and ctx.is_main:
            log.info(f"no checkpoint in {checkpoint} yet: starting from scratch")
        hk.broadcast_state(model, optimizer)  # hvdkit: everyone starts from rank 0's weights
    # hvdkit: with a checkpoint, SIGTERM/SIGUSR1 on any rank (a cluster's preemption notice) means:
    # checkpoint after the current step on every rank, then exit 75 so the job can be requeued and --resume.
    guard = hk.PreemptionGuard() if checkpoint else None

    if ctx.is_main:  # hvdkit:
        log.info(f"{args.dataset}: {len(train_set)} train / {len(test_set)} test samples, "
                 f"{ctx.size} processes on {ctx.cross_size} host(s) x batch {args.batch_size}, "
                 + (f"global batch {args.global_batch}, " if args.global_batch else "") + f"lr {lr:g}")
    start = time.time()
    metrics = hk.evaluate(model, test_loader) if start_epoch >= args.epochs else None  # resumed a finished run
    for epoch in range(start_epoch, args.epochs):
        model.train()
        # hvdkit: the same shuffle on all ranks; a resumed epoch goes on from the sample it stopped at
        if args.global_batch:
            train_loader.set_epoch(epoch, start_step=start_sample // args.global_batch)
        else:
            train_loader.sampler.set_epoch(epoch, start_sample=start_sample)
        batches = hk.progress(train_loader, ctx.rank, desc=f"epoch {epoch + 1}/{args.epochs}")  # hvdkit:
        loss_sum, seen = 0.0, 0
        for batch, item in enumerate(batches):
            optimizer.zero_grad()
            # hvdkit: with --global-batch, an item is one step: this process's micro-batches of it (maybe none)
            for x, y in item if args.global_batch else [item]:
                x, y = x.to(ctx.device), y.to(ctx.device)
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                loss_sum, seen = loss_sum + loss.item() * len(x), seen + len(x)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            if guard is not None and guard.requested():  # hvdkit: the same answer on every rank
                done = (min(train_loader.steps_done * args.global_batch, len(train_set)) if args.global_batch
                        else train_loader.sampler.position(batch + 1))
                # hvdkit: rank 0 writes; no rank exits 75 until the checkpoint is on disk
                guard.save_and_exit(save, checkpoint, bool(args.checkpoint_dir), model, optimizer, scheduler,
                                    epoch, done, len(train_set))
        start_sample = 0
        loss_total, count = hk.allreduce_sum([loss_sum, seen], "train_loss").tolist()  # hvdkit: over all ranks
        train_loss = loss_total / max(count, 1)
        metrics = hk.evaluate(model, test_loader)  # hvdkit: exact over the whole test set
        if ctx.is_main:  # hvdkit:
            log.info(f"epoch {epoch + 1}: train loss {train_loss:.4f}  test loss {metrics['loss']:.4f}  "
                     f"test accuracy {metrics['accuracy']:.2%} ({metrics['count']} samples)")
        if checkpoint:
            save(checkpoint, bool(args.checkpoint_dir), model, optimizer, scheduler, epoch, len(train_set),
                 len(train_set))

    if ctx.is_main:  # hvdkit:
        elapsed = time.time() - start
        log.info(f"final test accuracy {metrics['accuracy']:.2%} in {elapsed:.1f}s")
        if args.json:
            print(json.dumps({"dataset": args.dataset, "size": ctx.size, "hosts": ctx.cross_size,
                              "epochs": args.epochs, "compression": args.compression,
                              "test_accuracy": metrics["accuracy"], "test_loss": metrics["loss"],
                              "test_count": metrics["count"], "seconds": round(elapsed, 2)}))


if __name__ == "__main__":
    main()
