"""Worker: hvdkit.keras checkpoint directories (keep-last, fallback past a damaged newest), a save
that the test kills mid-write (--task slow_save loops until killed), and loading by name (--task by_name)."""

import argparse
import logging
import os

import numpy as np
from keras_common import parse_args
from rank_results import write_result

import hvdkit.keras as hk

p = argparse.ArgumentParser()
p.add_argument("--task", choices=["save_dir", "load_dir", "slow_save", "by_name"], required=True)
p.add_argument("--ckpt", help="slow_save: the checkpoint file")
args = parse_args(p)

keras = hk.use_backend(args.mode)   # before init, which reads the backend
ctx = hk.init(threads=1)
ckpt_dir = os.path.join(args.out, "ckpts") + os.sep


def build(width, layers=1):
    return keras.Sequential([keras.Input((width,))] + [keras.layers.Dense(width) for _ in range(layers)])


def fill(model, value):
    for v in model.variables:
        v.assign(np.full(tuple(v.shape), value, dtype="float32"))


result = {"rank": ctx.rank, "size": ctx.size}
if args.task == "save_dir":
    model = build(4)
    for step in (1, 2, 3):
        fill(model, float(step))
        hk.save_checkpoint(ckpt_dir, model, step=step, keep_last=2, epoch=step)
    result["files"] = sorted(os.listdir(ckpt_dir)) if ctx.is_main else None
elif args.task == "load_dir":
    warnings = []

    class Collect(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    logging.getLogger("hvdkit.checkpoint").addHandler(Collect(logging.WARNING))
    model = build(4)
    result["extra"] = hk.load_checkpoint(ckpt_dir, model)
    result["values"] = sorted({float(x) for w in model.get_weights() for x in np.ravel(w)})
    result["warnings"] = warnings
elif args.task == "by_name":
    def attempt(fn):
        try:
            fn()
            return None
        except Exception as exc:  # noqa: BLE001 - the test reads the type and message
            return f"{type(exc).__name__}: {exc}"

    path = os.path.join(args.out, "named.npz")
    saved = build(4, layers=2)
    fill(saved, 3.0)
    hk.save_checkpoint(path, saved, epoch=1)
    again = build(4, layers=2)            # the same architecture; Keras named its layers dense_2, dense_3
    result["same_architecture"] = attempt(lambda: hk.load_checkpoint(path, again))
    result["values"] = sorted({float(x) for w in again.get_weights() for x in np.ravel(w)})
    result["wider"] = attempt(lambda: hk.load_checkpoint(path, build(5, layers=2)))
    result["deeper"] = attempt(lambda: hk.load_checkpoint(path, build(4, layers=3)))
    # broadcast_state when rank 1 built another model: an error on every rank, not a hang
    result["broadcast"] = attempt(lambda: hk.broadcast_state(build(4 + ctx.rank)))
else:
    small = build(4)
    fill(small, 1.5)
    hk.save_checkpoint(args.ckpt, small, epoch=7)
    with open(os.path.join(args.out, "saved-first"), "w") as f:
        f.write(str(os.getpid()))
    big = build(4096, layers=8)                     # ~0.5 GB of float32: the save takes a while
    while True:                                     # until killed
        hk.save_checkpoint(args.ckpt, big, epoch=8)
write_result(args.out, ctx.rank, result)
