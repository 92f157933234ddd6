"""Issue 39: optimizer-state memory per rank and step time, sharded against unsharded hvdkit and torch's ZeRO.

Run from the repository root: .venv/bin/python docs/bench/sharded_state.py [--steps 5] [--np 1,2,4] [--runs 3]
Each (model, world size, implementation) is one job on this host; at one size the implementations take turns,
--runs rounds of them: hvdkit (DistributedOptimizer, Adam), hvdkit-sharded (shard_optimizer_state=True) under
horovodrun, and torch-zero (DistributedDataParallel + torch.distributed.optim.ZeroRedundancyOptimizer over Adam, Gloo)
under torchrun. Memory is the bytes of the optimizer state each rank holds (every tensor in the state, the
largest rank's), time the median of the timed steps on rank 0. The table goes to stdout and
docs/bench/sharded_state.txt.

Keras 3 on TensorFlow (keras.applications.ResNet50, the resnet50 model only), in the same run as its torch
peers: .venv/bin/python docs/bench/sharded_state.py --models resnet50 --impls keras,keras-sharded,hvdkit,
hvdkit-sharded,torch-zero --table sharded_state_keras.txt. Its memory is the bytes of optimizer.variables
(the slots, the step count and the rate), and "copies MiB" the slices of the weights a sharded rank keeps
beside them (docs/ADAPTERS.md); its step is model.train_on_batch (fit's compiled step).
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMPLS = ("hvdkit", "hvdkit-sharded", "torch-zero", "keras", "keras-sharded")


def transformer():
    import torch.nn as nn

    class Encoder(nn.Module):
        """A 6-layer, 512-wide encoder with an 8000-token embedding and head: 27M parameters."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(8000, 512)
            layer = nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, batch_first=True)
            self.body = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
            self.head = nn.Linear(512, 8000)

        def forward(self, tokens):
            return self.head(self.body(self.embed(tokens))).flatten(0, 1)

    return Encoder()


def batch(model_name, size, generator):
    import torch

    if model_name == "resnet50":
        return torch.randn(size, 3, 64, 64, generator=generator), torch.randint(0, 10, (size,), generator=generator)
    tokens = torch.randint(0, 8000, (size, 64), generator=generator)
    return tokens, tokens.flatten()


def keras_worker(args):
    import numpy as np

    import hvdkit.keras as hk
    from hvdkit.runtime.optimizer_record import record_of

    keras = hk.use_backend("tensorflow")
    ctx = hk.init(seed=0, threads=1)
    model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10)
    optimizer = hk.DistributedOptimizer(keras.optimizers.Adam(1e-4),
                                        shard_optimizer_state=args.impl.endswith("sharded"))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    hk.broadcast_state(model, optimizer)           # builds the optimizer: its slots exist before the first step
    rng = np.random.default_rng(ctx.rank)
    times = []
    for step in range(args.warmup + args.steps):
        x = rng.standard_normal((args.batch_size, 64, 64, 3)).astype("float32")
        y = rng.integers(0, 10, args.batch_size)
        hk.metric_average(0.0, name="bench.barrier")
        start = time.perf_counter()
        model.train_on_batch(x, y)
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    state_bytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in optimizer.variables)
    record = record_of(optimizer)
    slices = None if record is None else record.slices
    copies = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in slices.slices) if slices else 0
    out = Path(args.out) / f"rank{ctx.rank}.json"
    out.write_text(json.dumps({"rank": ctx.rank, "size": ctx.size, "state_bytes": state_bytes, "copy_bytes": copies,
                               "params": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
                               "step_s": statistics.median(times)}))


def worker(args):
    if args.impl.startswith("keras"):
        return keras_worker(args)
    import torch
    import torch.nn.functional as F

    from hvdkit.bench.models import MODELS

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = MODELS["resnet50"]() if args.model == "resnet50" else transformer()
    if args.impl == "torch-zero":
        import torch.distributed as dist
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        model = DistributedDataParallel(model)
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4)
        state = lambda: optimizer.optim.state      # noqa: E731  (this rank's local optimizer)
        barrier = dist.barrier
    else:
        import hvdkit.torch as hk
        from hvdkit.torch.sharded import slices_of

        ctx = hk.init(seed=0, threads=1)
        rank, size = ctx.rank, ctx.size
        optimizer = hk.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4), model,
                                            shard_optimizer_state=args.impl == "hvdkit-sharded")
        hk.broadcast_state(model, optimizer)
        shards = slices_of(optimizer)
        state = lambda: shards.inner.state if shards is not None else optimizer.state     # noqa: E731
        barrier = lambda: hk.allreduce_sum(0.0, name="bench.barrier")                       # noqa: E731
    generator = torch.Generator().manual_seed(rank)
    times = []
    for step in range(args.warmup + args.steps):
        x, y = batch(args.model, args.batch_size, generator)
        barrier()
        start = time.perf_counter()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    state_bytes = sum(v.numel() * v.element_size() for s in state().values() for v in s.values()
                      if torch.is_tensor(v))
    params = sum(p.numel() for p in model.parameters())
    out = Path(args.out) / f"rank{rank}.json"
    out.write_text(json.dumps({"rank": rank, "size": size, "state_bytes": state_bytes, "params": params,
                               "step_s": statistics.median(times)}))


def launch(impl, model, np, args, out):
    py = Path(sys.executable)
    argv = [__file__, "--worker", "--impl", impl, "--model", model, "--batch-size", str(args.batch_size),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--out", str(out)]
    if impl == "torch-zero":
        cmd = [str(py.parent / "torchrun"), "--standalone", f"--nproc-per-node={np}", *argv]
    else:
        flag = ["--gloo"] if args.controller == "gloo" else []
        cmd = [str(py.parent / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", *flag, str(py), *argv]
    from hvdkit.bench.results import run_ranks

    ranks = run_ranks(cmd, np, out, f"{impl} {model} np={np}", PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    return {"state_mib": max(r["state_bytes"] for r in ranks) / 2**20, "step_s": ranks[0]["step_s"],
            "params": ranks[0]["params"], "copy_mib": max(r.get("copy_bytes", 0) for r in ranks) / 2**20}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--impl", choices=IMPLS)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--models", default="resnet50,transformer")
    p.add_argument("--np", default="1,2,4")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--runs", type=int, default=3, help="rounds in which the implementations take turns")
    p.add_argument("--controller", choices=("mpi", "gloo"), default="mpi",
                   help="hvdkit's controller: MPI, what hvdkit launch runs on one host, or Gloo, torch's backend here")
    p.add_argument("--out", default="/tmp/sharded-state")
    p.add_argument("--impls", default="hvdkit,hvdkit-sharded,torch-zero")
    p.add_argument("--table", default="sharded_state.txt", help="the file under docs/bench/")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    from hvdkit.bench.results import write_table

    impls = args.impls.split(",")
    unknown = [impl for impl in impls if impl not in IMPLS]
    if unknown:
        raise SystemExit(f"error: unknown implementation {unknown[0]!r}: give some of {', '.join(IMPLS)}")
    rows = []
    for model in args.models.split(","):
        for np in (int(n) for n in args.np.split(",")):
            # The implementations take turns, round after round: a busy minute on the machine then falls on
            # every one of them, not on one.
            runs = {impl: [] for impl in impls}
            for round_ in range(args.runs):
                for impl in impls:
                    out = Path(args.out) / f"{model}-{np}-{impl}-{round_}"
                    out.mkdir(parents=True, exist_ok=True)
                    load = os.getloadavg()[0]
                    runs[impl].append({"load": load, **launch(impl, model, np, args, out)})
                    print(json.dumps({"model": model, "np": np, "impl": impl, "round": round_, **runs[impl][-1]}),
                          flush=True)
            for impl in impls:
                steps = [r["step_s"] for r in runs[impl]]
                rows.append({**runs[impl][0], "model": model, "np": np, "impl": impl, "steps": steps,
                             "step_s": statistics.median(steps), "load": max(r["load"] for r in runs[impl])})
    # Each framework's share is of its own unsharded state at the same size.
    base = {(r["impl"].startswith("keras"), r["model"], r["np"]): r for r in rows if r["impl"] in ("hvdkit", "keras")}
    zero = {(r["model"], r["np"]): r for r in rows if r["impl"] == "torch-zero"}
    lines = [f"hvdkit under horovodrun's {args.controller.upper()} controller, torch-zero under Gloo; "
             f"Adam, batch {args.batch_size} a rank, {args.steps} timed steps after {args.warmup}, {args.runs} "
             "interleaved run(s); step s: the median of the runs' medians (rank 0), each run's in brackets; "
             "state: the largest rank's optimizer state; share: of unsharded hvdkit's at the same size; "
             "x unsharded, x ZeRO: the step against those medians",
             f"{'model':<12}{'np':>3}  {'impl':<15}{'state MiB':>10}{'share':>8}{'copies MiB':>11}{'step s':>9}"
             f"{'x unsharded':>12}{'x ZeRO':>8}{'load':>6}  runs"]
    for r in rows:
        unsharded = base.get((r["impl"].startswith("keras"), r["model"], r["np"]))
        share = r["state_mib"] / unsharded["state_mib"] if unsharded else float("nan")
        vs_plain = r["step_s"] / unsharded["step_s"] if unsharded else float("nan")
        peer = zero.get((r["model"], r["np"]))
        vs_zero = r["step_s"] / peer["step_s"] if peer else float("nan")
        lines.append(f"{r['model']:<12}{r['np']:>3}  {r['impl']:<15}{r['state_mib']:>10.1f}{share:>8.3f}"
                     f"{r['copy_mib']:>11.1f}{r['step_s']:>9.3f}{vs_plain:>12.2f}{vs_zero:>8.2f}{r['load']:>6.2f}  "
                     f"[{', '.join(f'{t:.3f}' for t in r['steps'])}]")
    write_table(ROOT / "docs" / "bench" / args.table, lines)


if __name__ == "__main__":
    main()
