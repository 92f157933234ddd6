"""Worker: each rank prints --lines numbered lines as fast as it can (what interleaves in a launcher's output)."""

import argparse

import hvdkit.torch as hk

p = argparse.ArgumentParser()
p.add_argument("--lines", type=int, default=3000)
args = p.parse_args()
ctx = hk.init(threads=1)
for i in range(args.lines):
    print(f"rank {ctx.rank} line {i} " + "x" * 40)
