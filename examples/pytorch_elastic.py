"""Elastic data-parallel training: keeps going when workers are lost, added or removed.

    horovodrun -np 2 --min-np 1 --max-np 4 --network-interface lo --host-discovery-script examples/discover_hosts.sh \\
        python examples/pytorch_elastic.py                     # edit hostfiles/elastic while it runs
    horovodrun -np 4 --min-np 3 -H a:1,b:1,c:1,d:1 python examples/pytorch_elastic.py   # survives losing one
    ... python examples/pytorch_elastic.py --checkpoint-dir ckpts/ --resume       # survives the whole job ending

Rank 0 prints one line per commit ("committed step N ... size S"): training
resumes from the last of them after any change. A commit lives in the
workers' memory, so it is lost when the whole job ends (a cluster that stops
every worker, as the MPI Operator does when a pod is evicted): with
--checkpoint-dir each epoch's end is saved, and SIGTERM or SIGUSR1 on any
worker makes every rank save after the current step and exit 75; --resume
then starts from the newest checkpoint (or from scratch while there is none).
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
from hvdkit.argtypes import positive_float, positive_int
from hvdkit.examples.datasets import DATASETS, DatasetError, load_dataset


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=DATASETS, default="digits")
    p.add_argument("--data-dir", default="data/mnist")
    p.add_argument("--epochs", type=positive_int, default=10)
    p.add_argument("--batch-size", type=positive_int, default=16, help="per process")
    p.add_argument("--lr", type=positive_float, default=0.01, help="single-process learning rate")
    p.add_argument("--commit-every", type=positive_int, default=1,
                   help="steps between commits (a commit copies the state)")
    p.add_argument("--shard-optimizer-state", action="store_true",
                   help="keep 1/N of the optimizer state on each process (ZeRO stage 1); a commit gathers it")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="save after every epoch and on SIGTERM/SIGUSR1 (then exit 75) as DIR/ckpt-<step>.pt, "
                        "keeping the newest 3")
    p.add_argument("--resume", action="store_true",
                   help="start from the newest good checkpoint in --checkpoint-dir (from scratch while there is none)")
    p.add_argument("--json", action="store_true", help="print the final metrics as JSON")
    args = p.parse_args()
    if args.resume and not args.checkpoint_dir:
        p.error("--resume needs --checkpoint-dir DIR: the directory to resume from")
    return args


def main():
    args = parse_args()
    # A path ending in '/' is a checkpoint directory to hvdkit, even before it exists.
    checkpoint = os.path.join(args.checkpoint_dir, "") if args.checkpoint_dir else None
    ctx = hk.init(seed=args.seed)  # hvdkit:
    try:
        data = load_dataset(args.dataset, args.data_dir, seed=args.seed)
    except DatasetError as exc:
        raise SystemExit(f"error: {exc}") from None
    train_set = TensorDataset(torch.from_numpy(data.x_train).flatten(1), torch.from_numpy(data.y_train))
    test_set = TensorDataset(torch.from_numpy(data.x_test).flatten(1), torch.from_numpy(data.y_test))
    train_loader = hk.elastic.elastic_loader(train_set, args.batch_size, seed=args.seed)  # hvdkit: re-shards on resize
    test_loader = hk.eval_loader(test_set, batch_size=256)  # hvdkit:

    model = nn.Sequential(nn.Linear(28 * 28, 256), nn.ReLU(), nn.Linear(256, 10)).to(ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=hk.scale_lr(args.lr), momentum=0.9)  # hvdkit: lr x size
    optimizer = hk.DistributedOptimizer(optimizer, model,  # hvdkit:
                                        shard_optimizer_state=args.shard_optimizer_state)
    # hvdkit: what a commit holds; its first sync gives every rank rank 0's weights
    state = hk.elastic.ElasticState(model, optimizer, sampler=train_loader.sampler,
                                    base_lr=args.lr, commit_every=args.commit_every)

    def log_commit(s):  # hvdkit: rank 0 reports each commit
        if hk.current().is_main:
            print(f"committed step {s.step} epoch {s.epoch} size {hk.current().size}", flush=True)

    state.register_commit_callbacks([log_commit])  # hvdkit:
    # hvdkit: SIGTERM/SIGUSR1 on any rank: every rank saves after the current step, then all exit 75
    guard = hk.PreemptionGuard() if checkpoint else None

    def save(s):  # hvdkit: on every rank (a sharded optimizer is gathered); rank 0 writes
        try:
            hk.save_checkpoint(checkpoint, model, optimizer, step=s.step, keep_last=3, epoch=s.epoch,
                               sampler=train_loader.sampler.state_dict())  # where this epoch stands
        except hk.CheckpointError as exc:  # e.g. the disk filled up: one line, the previous checkpoint kept
            raise SystemExit(f"error: {exc}") from None

    def resume(s):  # hvdkit: collective: rank 0 reads, every rank loads; rates rescaled for this size
        hk.check_checkpoint_path(checkpoint, model, optimizer, keep_last=3)
        extra = hk.load_checkpoint(checkpoint, model, optimizer, missing_ok=True) if args.resume else None
        if extra is not None:
            s.epoch, s.step = extra["epoch"], extra["step"]
            train_loader.sampler.load_state_dict(extra["sampler"])  # the epoch's order, from its next sample
            if hk.current().is_main:  # hvdkit:
                print(f"resumed from step {s.step} epoch {s.epoch} of {checkpoint}", flush=True)

    @hk.elastic.run  # hvdkit: on a lost worker or a host change, restore the last commit and carry on
    def train(state):
        # Step 0 after the sync (rank 0's state) on every rank is the job's start, not a worker that joins later:
        # the checkpoint is read here, inside the sync, because a collective before it would wait for ranks
        # that are already training.
        if checkpoint and state.step == 0:  # hvdkit:
            try:
                resume(state)
            except hk.CheckpointError as exc:  # unwritable, full or damaged: one line, on every rank
                raise SystemExit(f"error: {exc}") from None
        while state.epoch < args.epochs:
            model.train()
            for x, y in train_loader:
                x, y = x.to(ctx.device), y.to(ctx.device)
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                state.step_done(args.batch_size)  # hvdkit: count the step, commit when due
                if guard is not None and guard.requested():  # hvdkit: the same answer on every rank
                    guard.save_and_exit(save, state)  # hvdkit: no rank exits 75 until the checkpoint is on disk
            state.epoch_done()  # hvdkit:
            if checkpoint:
                save(state)  # hvdkit: every epoch's end, for a job that is stopped whole

    start = time.time()
    train(state)
    metrics = hk.evaluate(model, test_loader)  # hvdkit: exact over the whole test set
    if hk.current().is_main:  # hvdkit:
        print(f"final test accuracy {metrics['accuracy']:.2%} after {state.step} steps, "
              f"{time.time() - start:.1f}s", flush=True)
        if args.json:
            print(json.dumps({"test_accuracy": metrics["accuracy"], "steps": state.step,
                              "size": hk.current().size, "epochs": state.epoch}), flush=True)


if __name__ == "__main__":
    main()
