"""Worker: save a good checkpoint, then start saving a large one (the test kills us mid-write).
With --once: save the good checkpoint and exit (the save after a killed one)."""

import argparse
import os

import torch
import torch.nn as nn

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--ckpt", required=True)
p.add_argument("--once", action="store_true")
p.add_argument("--background", action="store_true", help="the large saves with blocking=False")
args = p.parse_args()

ctx = hk.init(threads=1)
small = nn.Linear(4, 4)
with torch.no_grad():
    small.weight.fill_(1.5)
hk.save_checkpoint(args.ckpt, small, epoch=7)
if args.once:
    raise SystemExit(0)
with open(os.path.join(args.out, "saved-first"), "w") as f:
    f.write(str(os.getpid()))
big = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(60)])    # ~1 GB of float32
while True:                                                          # until killed
    hk.save_checkpoint(args.ckpt, big, epoch=8, blocking=not args.background)
