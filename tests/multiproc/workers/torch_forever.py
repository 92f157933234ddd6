"""Worker: allreduce in a loop until killed; writes its pid and host first, and ``looping<rank>``
once 20 allreduces have completed (so a fault test knows both ranks are inside the loop)."""

import argparse
import json
import os
import socket
import time

import torch

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args = p.parse_args()
ctx = hk.init(threads=1)
with open(os.path.join(args.out, f"pid{ctx.rank}.json"), "w") as f:
    json.dump({"rank": ctx.rank, "size": ctx.size, "pid": os.getpid(), "host": socket.gethostname()}, f)
step = 0
while True:
    hk.hvd.allreduce(torch.ones(1024), name=f"step{step % 8}")
    step += 1
    if step == 20:
        open(os.path.join(args.out, f"looping{ctx.rank}"), "w").close()
    time.sleep(0.01)
