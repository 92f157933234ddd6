"""Issue 55: samples per second of a fixed global batch against the per-rank batch, at an equal global batch.

Run from the repository root: .venv/bin/python docs/bench/global_batch.py [--rounds 3] [--np 1,2,4]
Each (model, world size, mode) is one horovodrun --gloo job on this host, run in turn, and the whole set
--rounds times, interleaved:

- per-rank: hk.distributed_loader with global/np a rank, one backward a step (Horovod's usual mode);
- global-1: hk.global_batch_loader(global, micro_batch=global/np): one micro-batch a rank, the same work
  as per-rank plus what the mode adds (a weight per gradient, a forked random generator per micro-batch);
- global-4: hk.global_batch_loader(global, micro_batch=global/4): the grouping that stays the same from 1
  to 4 ranks (docs/GLOBAL_BATCH.md), so 4 micro-batches accumulated on 1 rank, 2 on 2, 1 on 4.

SGD with momentum, float32; a job's time is the median of its timed steps on rank 0, from a barrier to the
end of optimizer.step(), and a row's the median of its rounds; samples/s is the global batch over it. The
table goes to stdout and docs/bench/global_batch.txt.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = ("per-rank", "global-1", "global-4")
GLOBAL = {"convnet": 64, "resnet50": 16}
STEPS = {"convnet": 30, "resnet50": 5}          # timed steps a job: a convnet step takes 20-30 ms here


def worker(args):
    import torch
    import torch.nn.functional as F
    from torch.utils.data import TensorDataset

    import hvdkit.torch as hk
    from hvdkit.bench.models import MODELS

    ctx = hk.init(seed=0, threads=1)
    if args.model == "convnet":
        sys.path.insert(0, str(ROOT / "examples"))
        from pytorch_mnist import Net

        model, shape = Net(), (1, 28, 28)
    else:
        model, shape = MODELS["resnet50"](), (3, 64, 64)
    g = torch.Generator().manual_seed(0)
    total = args.global_batch * (args.warmup + args.steps)
    data = TensorDataset(torch.randn(total, *shape, generator=g), torch.randint(0, 10, (total,), generator=g))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if args.mode == "per-rank":
        loader = hk.distributed_loader(data, args.global_batch // ctx.size, num_workers=0)
        optimizer = hk.DistributedOptimizer(optimizer, model)
        loader.sampler.set_epoch(0)
        steps = ([batch] for batch in loader)
    else:
        micro = args.global_batch // (ctx.size if args.mode == "global-1" else 4)
        loader = hk.global_batch_loader(data, args.global_batch, micro, num_workers=0)
        optimizer = hk.DistributedOptimizer(optimizer, model, global_batch=loader)
        loader.set_epoch(0)
        steps = iter(loader)
    hk.broadcast_state(model, optimizer)
    times = []
    for i in range(args.warmup + args.steps):
        hk.allreduce_sum(0.0, name="bench.barrier")
        start = time.perf_counter()
        optimizer.zero_grad()
        for x, y in next(steps):
            F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    out = Path(args.out) / f"rank{ctx.rank}.json"
    out.write_text(json.dumps({"rank": ctx.rank, "size": ctx.size, "step_s": statistics.median(times)}))


def launch(mode, model, np, args, out):
    py = Path(sys.executable)
    argv = [__file__, "--worker", "--mode", mode, "--model", model, "--global-batch", str(GLOBAL[model]),
            "--steps", str(STEPS[model]), "--warmup", str(args.warmup), "--out", str(out)]
    cmd = [str(py.parent / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", "--gloo", str(py), *argv]
    from hvdkit.bench.results import run_ranks

    return run_ranks(cmd, np, out, f"{mode} {model} np={np}", PYTHONPATH=str(ROOT))[0]["step_s"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--mode", choices=MODES)
    p.add_argument("--model", default="convnet")
    p.add_argument("--models", default="convnet,resnet50")
    p.add_argument("--np", default="1,2,4")
    p.add_argument("--global-batch", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default="/tmp/global-batch-bench")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    from hvdkit.bench.results import write_table

    runs: dict = {}
    for round_ in range(args.rounds):
        for model in args.models.split(","):
            for np in (int(n) for n in args.np.split(",")):
                for mode in MODES:
                    out = Path(args.out) / f"{model}-{np}-{mode}-{round_}"
                    out.mkdir(parents=True, exist_ok=True)
                    load = os.getloadavg()[0]
                    step_s = launch(mode, model, np, args, out)
                    runs.setdefault((model, np, mode), []).append((step_s, load))
                    print(json.dumps({"round": round_, "model": model, "np": np, "mode": mode, "step_s": step_s,
                                      "load": load}), flush=True)
    rows = []
    for (model, np, mode), measured in runs.items():
        step_s = statistics.median(s for s, _ in measured)
        rows.append({"model": model, "np": np, "mode": mode, "step_s": step_s, "samples_s": GLOBAL[model] / step_s,
                     "load": max(load for _, load in measured)})
    base = {(r["model"], r["np"]): r for r in rows if r["mode"] == "per-rank"}
    lines = [f"SGD, float32, {', '.join(f'{m} {g} a step, {STEPS[m]} timed' for m, g in GLOBAL.items())} "
             f"after {args.warmup}; median of {args.rounds} interleaved rounds; ratio: samples/s over per-rank's at "
             "that size; load: the highest 1-minute load average at a job's start",
             f"{'model':<10}{'np':>3}  {'mode':<10}{'step s':>8}{'samples/s':>11}{'ratio':>7}{'load':>6}"]
    for r in rows:
        ratio = r["samples_s"] / base[(r["model"], r["np"])]["samples_s"]
        lines.append(f"{r['model']:<10}{r['np']:>3}  {r['mode']:<10}{r['step_s']:>8.3f}{r['samples_s']:>11.1f}"
                     f"{ratio:>7.2f}{r['load']:>6.2f}")
    write_table(ROOT / "docs" / "bench" / "global_batch.txt", lines)


if __name__ == "__main__":
    main()
