"""Worker: what a job pool's scenario sees (tests/multiproc/test_job_pool.py): its pid, Horovod's controller and a
sum over the ranks after hk.init; with --fail-rank R, rank R exits 3 before hk.init while the others go into it."""

import argparse
import os
import sys

from rank_results import write_result

from hvdkit.common.launcher import detect

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--fail-rank", type=int, default=None)
args = p.parse_args()

rank = detect().rank                    # before hk.init, as the launcher said
if rank == args.fail_rank:
    print(f"rank {rank} fails before hk.init", file=sys.stderr)
    sys.exit(3)

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

import hvdkit.torch as ht  # noqa: E402

ctx = ht.init(seed=0)
total = hvd.allreduce(torch.tensor([ctx.rank + 1.0]), op=hvd.Sum).item()
write_result(args.out, ctx.rank, {"size": ctx.size, "pid": os.getpid(), "total": total,
                                  "mpi": hvd.mpi_enabled(), "gloo": hvd.gloo_enabled()})
