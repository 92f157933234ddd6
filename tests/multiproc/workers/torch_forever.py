"""Worker: allreduce in a loop until killed; writes its pid and host first, and ``looping<rank>``
once 20 allreduces have completed (so a fault test knows both ranks are inside the loop)."""

import argparse
import os
import socket
import time

import torch
from rank_results import write_result

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args = p.parse_args()
ctx = hk.init(threads=1)
write_result(args.out, ctx.rank, {"rank": ctx.rank, "size": ctx.size, "pid": os.getpid(), "host": socket.gethostname()},
             prefix="pid")
step = 0
while True:
    hk.hvd.allreduce(torch.ones(1024), name=f"step{step % 8}")
    step += 1
    if step == 20:
        open(os.path.join(args.out, f"looping{ctx.rank}"), "w").close()
    time.sleep(0.01)
