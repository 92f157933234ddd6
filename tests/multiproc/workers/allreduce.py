"""Worker: init Horovod in one framework, run allreduce/broadcast/allgather, write rank<R>.json."""

import argparse
import os

import numpy as np
from rank_results import write_result

p = argparse.ArgumentParser()
p.add_argument("--framework", choices=["torch", "tensorflow"], required=True)
p.add_argument("--out", required=True)
args = p.parse_args()

N = 1000
if args.framework == "torch":
    import horovod.torch as hvd
    import torch

    hvd.init()
    base = torch.arange(N, dtype=torch.float32) * (hvd.rank() + 1)
    avg = hvd.allreduce(base, op=hvd.Average, name="avg").numpy()
    total = hvd.allreduce(base, op=hvd.Sum, name="sum").numpy()
    bcast = hvd.broadcast(torch.full((4,), float(hvd.rank())), root_rank=0, name="bcast").numpy()
    gathered = hvd.allgather(torch.tensor([hvd.rank()]), name="gather").numpy()
else:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    base = tf.range(N, dtype=tf.float32) * float(hvd.rank() + 1)
    avg = hvd.allreduce(base, op=hvd.Average, name="avg").numpy()
    total = hvd.allreduce(base, op=hvd.Sum, name="sum").numpy()
    bcast = hvd.broadcast(tf.fill([4], float(hvd.rank())), root_rank=0, name="bcast").numpy()
    gathered = hvd.allgather(tf.constant([hvd.rank()]), name="gather").numpy()

size = hvd.size()
expected = np.arange(N, dtype=np.float32)
result = {
    "rank": hvd.rank(),
    "size": size,
    "local_size": hvd.local_size(),
    "mpi_enabled": bool(hvd.mpi_enabled()),
    "gloo_enabled": bool(hvd.gloo_enabled()),
    "avg_ok": bool(np.allclose(avg, expected * (size + 1) / 2)),
    "sum_ok": bool(np.allclose(total, expected * size * (size + 1) / 2)),
    "bcast": bcast.tolist(),
    "gathered": gathered.tolist(),
    "pid": os.getpid(),
}
write_result(args.out, hvd.rank(), result)
