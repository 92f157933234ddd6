"""Worker: save a checkpoint, then save again and SIGKILL rank 0 the instant its new file is renamed into
place (what a node failure or the OOM killer does between two writes). With --resume: load and report."""

import argparse
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))

import torch.nn as nn  # noqa: E402
from rank_results import write_result  # noqa: E402

import hvdkit.torch as hk  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--ckpt", required=True)
p.add_argument("--resume", action="store_true")
args = p.parse_args()

ctx = hk.init(threads=1)
model = nn.Linear(4, 4)
if args.resume:
    extra = hk.load_checkpoint(args.ckpt, model)
    write_result(args.out, ctx.rank, {"size": ctx.size, "extra": extra})
    raise SystemExit(0)

hk.save_checkpoint(args.ckpt, model, epoch=0)
replace = os.replace


def replace_then_die(src, dst):
    replace(src, dst)
    if os.path.abspath(dst) == os.path.abspath(args.ckpt):
        os.kill(os.getpid(), signal.SIGKILL)


os.replace = replace_then_die
hk.save_checkpoint(args.ckpt, model, epoch=1)
hk.metric_average(0.0, "never reached on rank 0")
