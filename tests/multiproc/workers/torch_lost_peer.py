"""Worker: 4 ranks allreduce a 16 MB tensor in a loop until Horovod fails; rank 3 SIGKILLs itself a quarter
into its fourth allreduce (timed by its third), while the data is on the wire.

Writes pid<rank>.json first. A survivor prints the error Horovod raised and exits 3 half a second later
(an elastic job's background loop runs on that long, until its reset shuts Horovod down). Rank 0 runs at
nice 19: as the slowest receiver, its sender (rank 1) is more often ahead of it when its own send to
rank 3 fails. SIGTERM is ignored, so that horovodrun's terminating the others once rank 3 has died cannot
end a survivor before it met the failure (horovodrun's SIGKILL still follows 5 s later).
"""

import argparse
import os
import signal
import time

import torch
from horovod.common.exceptions import HorovodInternalError
from rank_results import write_result

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args = p.parse_args()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
ctx = hk.init(threads=1)
if ctx.rank == 0:
    os.nice(19)
write_result(args.out, ctx.rank, {"rank": ctx.rank, "size": ctx.size, "pid": os.getpid()}, prefix="pid")
grads = torch.ones(4_000_000)
step, took = 0, 0.0
try:
    while True:
        if ctx.rank == 3 and step == 3:     # a quarter into the allreduce, as long as the last one took
            hk.hvd.allreduce_async(grads, name="grads")
            time.sleep(took / 4)
            os.kill(os.getpid(), signal.SIGKILL)
        start = time.perf_counter()
        hk.hvd.allreduce(grads, name="grads")
        took = time.perf_counter() - start
        step += 1
except HorovodInternalError as e:
    print(f"rank {ctx.rank} got HorovodInternalError after {step} allreduces: {str(e).splitlines()[0][:200]}",
          flush=True)
    time.sleep(0.5)
    os._exit(3)
