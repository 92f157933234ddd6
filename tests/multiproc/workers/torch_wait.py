"""Worker: rank 1 comes --late seconds late to an allreduce; every rank reports the CPU time its main thread
spent waiting in it (HOROVOD_BLOCKING_WAIT, patch item 11, decides whether that thread spins or sleeps)."""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402
from rank_results import write_result  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--late", type=float, default=2.0)
args = p.parse_args()

hvd.init()
hvd.allreduce(torch.ones(4), name="warmup")
if hvd.rank() == 1:
    time.sleep(args.late)
wall, cpu = time.monotonic(), time.thread_time()
total = hvd.allreduce(torch.ones(4), op=hvd.Sum, name="late").tolist()
write_result(args.out, hvd.rank(), {"size": hvd.size(), "total": total,
                                    "wait_s": time.monotonic() - wall, "cpu_s": time.thread_time() - cpu})
