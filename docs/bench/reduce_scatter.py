"""Issue 39: what averaging ResNet-50's gradients by reduce-scatter would save a sharded step, per controller.

Run from the repository root: .venv/bin/python docs/bench/reduce_scatter.py [--np 2,3] [--repeats 5]
Each (controller, world size) is one `hvdkit launch` job on this host (MPI, its default on one host, and
--gloo), run in turn. In each, the ranks time Horovod's grouped collectives over ResNet-50's 161 gradients
(25.6 M float32 values), the best of --repeats after one untimed call:

- allreduce: the whole average, what shard_optimizer_state=True does now (then every rank slices its part);
- reducescatter: each rank gets the average of its 1/N of every gradient (each padded to a multiple of N);
- allgather: the updated slices shared after the step, which both designs do.

A sharded step's wire time is allreduce + allgather now, reducescatter + allgather with a reduce-scatter. The
table goes to stdout and docs/bench/reduce_scatter.txt.
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COLLECTIVES = ("allreduce", "reducescatter", "allgather")


def worker(args):
    import torch

    import hvdkit.torch as hk
    from hvdkit.backends.torch import hvd
    from hvdkit.bench.models import MODELS

    ctx = hk.init(seed=1, threads=1)
    grads = [torch.randn_like(p.detach()) for p in MODELS["resnet50"]().parameters()]
    padded, slices = [], []
    for g in grads:
        chunk = math.ceil(g.numel() / ctx.size)
        flat = torch.zeros(chunk * ctx.size)
        flat[:g.numel()] = g.reshape(-1)
        padded.append(flat)
        slices.append(flat[ctx.rank * chunk:(ctx.rank + 1) * chunk].clone())
    calls = {"allreduce": lambda: hvd.grouped_allreduce(grads, op=hvd.Average, name="bench.ar"),
             "reducescatter": lambda: hvd.grouped_reducescatter(padded, op=hvd.Average, name="bench.rs"),
             "allgather": lambda: hvd.grouped_allgather(slices, name="bench.ag")}
    result = {"size": ctx.size, "values": sum(g.numel() for g in grads)}
    for name, call in calls.items():
        call()
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        result[name] = min(times)
    with open(os.path.join(args.out, f"rank{ctx.rank}.json"), "w") as f:
        json.dump(result, f)


def launch(controller, np, args, out):
    py = Path(sys.executable)
    flags = ["--gloo"] if controller == "gloo" else []
    cmd = [str(py.parent / "hvdkit"), "launch", "-np", str(np), "-H", f"localhost:{np}", *flags, "--", str(py),
           __file__, "--worker", "--repeats", str(args.repeats), "--out", str(out)]
    from hvdkit.bench.results import run_ranks

    ranks = run_ranks(cmd, np, out, f"{controller} np={np}", timeout=1200, PYTHONPATH=str(ROOT))
    return {name: max(r[name] for r in ranks) for name in COLLECTIVES}     # the slowest rank's


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--np", default="2,3")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="/tmp/reduce-scatter")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    from hvdkit.bench.results import write_table

    rows = []
    for controller in ("mpi", "gloo"):
        for np in (int(n) for n in args.np.split(",")):
            out = Path(args.out) / f"{controller}-{np}"
            out.mkdir(parents=True, exist_ok=True)
            load = os.getloadavg()[0]
            rows.append({"controller": controller, "np": np, "load": load, **launch(controller, np, args, out)})
            print(json.dumps(rows[-1]), flush=True)
    lines = [f"ResNet-50's 161 gradients (25.6 M float32), grouped; seconds, best of {args.repeats}, slowest rank",
             f"{'controller':<11}{'np':>3}{'allreduce':>11}{'reducescatter':>15}{'allgather':>11}"
             f"{'AR+AG (now)':>13}{'RS+AG':>8}{'RS+AG / AR+AG':>15}{'load':>6}"]
    for r in rows:
        now, scattered = r["allreduce"] + r["allgather"], r["reducescatter"] + r["allgather"]
        lines.append(f"{r['controller']:<11}{r['np']:>3}{r['allreduce']:>11.4f}{r['reducescatter']:>15.4f}"
                     f"{r['allgather']:>11.4f}{now:>13.4f}{scattered:>8.4f}{scattered / now:>15.2f}{r['load']:>6.2f}")
    write_table(ROOT / "docs" / "bench" / "reduce_scatter.txt", lines)


if __name__ == "__main__":
    main()
