"""Worker: hvd.init(), one allreduce, hvd.shutdown(), --cycles times (as Horovod's own test suites and every
elastic reset re-initialise). --late-rank R: rank R waits --late-seconds before its first init (a rank that
never reaches the rendezvous in time)."""

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
p.add_argument("--cycles", type=int, default=20)
p.add_argument("--late-rank", type=int, default=-1)
p.add_argument("--late-seconds", type=float, default=0.0)
args = p.parse_args()

rank = int(os.environ["HOROVOD_RANK"])
if rank == args.late_rank:
    time.sleep(args.late_seconds)
sums = []
try:
    for _ in range(args.cycles):
        hvd.init()
        sums.append(hvd.allreduce(torch.full((1024,), float(hvd.rank() + 1)), op=hvd.Sum, name="x")[0].item())
        size = hvd.size()
        hvd.shutdown()
except Exception as exc:              # an init that fails must be an exception, never an abort
    write_result(args.out, rank, {"error": f"{type(exc).__name__}: {exc}"})
    raise SystemExit(1) from None
write_result(args.out, rank, {"size": size, "cycles": len(sums), "sums": sorted(set(sums))})
