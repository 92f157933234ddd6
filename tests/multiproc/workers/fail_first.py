"""Worker: rank 1 fails with its own error and lingers before exiting; rank 0 fails only as a consequence."""

import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(__file__))

from rank_results import write_result  # noqa: E402

import hvdkit.torch as hk  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args = p.parse_args()
ctx = hk.init(threads=1)
write_result(args.out, ctx.rank, {"size": ctx.size})
if ctx.rank == 1:
    try:
        raise ValueError("bad record in shard 1")
    except ValueError:
        traceback.print_exc()
        sys.stderr.flush()
    hk.hvd.shutdown()           # rank 0's pending allreduce now fails...
    time.sleep(5)               # ...and rank 0 exits first
    os._exit(1)
hk.metric_average(1.0, "loss")
