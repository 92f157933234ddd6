"""Issue 53: how long a 1 GiB checkpoint blocks the training thread, blocking against in the background.

Run from the repository root: .venv/bin/python docs/bench/async_checkpoint.py [--rounds 3] [--np 1,2]
Each (world size, mode) is one horovodrun --gloo job on this host, run in turn, the whole set --rounds times:

- blocking: hk.save_checkpoint(path, model, optimizer): rank 0 digests, writes, fsyncs and renames;
- background: hk.save_checkpoint(..., blocking=False): rank 0 copies the state to host memory and returns; a
  thread writes. "host copy" is hvdkit.torch.tensors.host_copy of the same state, timed alone just before;
- dcp: torch.distributed.checkpoint.async_save of the same state dict over a Gloo process group beside
  Horovod (torch's own asynchronous checkpoint), until its call returns; its write is then waited for.

The state is the example's convnet with a 1 GiB buffer (SGD, float32). "blocked" is the time rank 0's training
thread spends in the save call; "write" the background write's duration; "step" the median step of the
convnet (batch 64 a rank) with no save in flight, "step in write" the median of the steps taken while the
background write runs (the write competes for the same cores), and their ratio. A row is the median of its
rounds. The table goes to stdout and docs/bench/async_checkpoint.txt.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = ("blocking", "background", "dcp")
BALLAST = 2**30


def worker(args):
    import torch
    import torch.nn.functional as F

    import hvdkit.torch as hk
    from hvdkit.runtime import async_save
    from hvdkit.torch.tensors import host_copy

    ctx = hk.init(seed=0, threads=1)
    sys.path.insert(0, str(ROOT / "examples"))
    from pytorch_mnist import Net

    model = Net()
    model.register_buffer("ballast", torch.ones(BALLAST // 4))
    optimizer = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
    hk.broadcast_state(model, optimizer)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))

    def step() -> float:
        start = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        return time.perf_counter() - start

    for _ in range(3):
        step()
    quiet = statistics.median(step() for _ in range(10))
    directory = tempfile.mkdtemp(dir=args.out)
    result = {"rank": ctx.rank, "size": ctx.size, "step_s": quiet, "copy_s": None, "write_s": None,
              "steps_in_write": 0, "step_in_write_s": None}
    if ctx.rank == 0:
        start = time.perf_counter()
        host_copy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
        result["copy_s"] = time.perf_counter() - start
    hk.allreduce_sum(0.0, name="bench.barrier")
    during = []

    def writing(mine: bool) -> bool:
        """Whether any rank's write is still running: every rank takes the same steps (they allreduce)."""
        return bool(hk.allreduce_sum(float(mine), name="bench.writing") > 0)

    if args.mode == "dcp":
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        dist.init_process_group("gloo", rank=ctx.rank, world_size=ctx.size,
                                init_method=f"tcp://127.0.0.1:{args.port}")
        group = dist.new_group(backend="gloo")
        start = time.perf_counter()
        future = dcp.async_save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                                checkpoint_id=os.path.join(directory, "dcp"), process_group=group)
        blocked = time.perf_counter() - start
        while writing(not future.done()):
            during.append(step())
        future.result()
        result["write_s"] = time.perf_counter() - start
        dist.destroy_process_group()
    else:
        start = time.perf_counter()
        hk.save_checkpoint(os.path.join(directory, "ckpt.pt"), model, optimizer, blocking=args.mode == "blocking")
        blocked = time.perf_counter() - start
        while writing(async_save.in_flight() and async_save._pending.thread.is_alive()):
            during.append(step())
        if async_save.in_flight():
            result["write_s"] = async_save._pending.seconds
            hk.wait_for_checkpoint()
    result.update(blocked_s=blocked, steps_in_write=len(during),
                  step_in_write_s=statistics.median(during) if during else None)
    (Path(args.out) / f"rank{ctx.rank}.json").write_text(json.dumps(result))


def launch(mode, np, args, out, port):
    py = Path(sys.executable)
    argv = [__file__, "--worker", "--mode", mode, "--out", str(out), "--port", str(port)]
    cmd = [str(py.parent / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", "--gloo", str(py), *argv]
    from hvdkit.bench.results import run_ranks

    return run_ranks(cmd, np, out, f"{mode} np={np}", PYTHONPATH=str(ROOT))[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--mode", choices=MODES)
    p.add_argument("--np", default="1,2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--out", default="/tmp/async-checkpoint-bench")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    from hvdkit.bench.results import write_table

    runs: dict = {}
    for round_ in range(args.rounds):
        for np in (int(n) for n in args.np.split(",")):
            for i, mode in enumerate(MODES):
                out = Path(args.out) / f"{np}-{mode}-{round_}"
                out.mkdir(parents=True, exist_ok=True)
                row = launch(mode, np, args, out, args.port + 10 * round_ + i)
                runs.setdefault((np, mode), []).append(row)
                print(json.dumps({"round": round_, "np": np, "mode": mode, **row}), flush=True)
                for leftover in out.glob("tmp*"):        # 1 GiB a job: not kept
                    os.system(f"rm -rf {leftover}")

    def median(rows, key):
        values = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(values) if values else None

    def cell(value, width, digits=3):
        return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"

    lines = [f"a {BALLAST >> 30} GiB checkpoint (the example's convnet and a 1 GiB buffer), rank 0; median of "
             f"{args.rounds} interleaved rounds; seconds",
             f"{'np':>3}  {'mode':<11}{'blocked':>9}{'host copy':>11}{'write':>8}{'step':>8}{'step in write':>15}"
             f"{'ratio':>7}{'steps':>7}"]
    for (np, mode), rows in runs.items():
        step_s, during = median(rows, "step_s"), median(rows, "step_in_write_s")
        lines.append(f"{np:>3}  {mode:<11}{cell(median(rows, 'blocked_s'), 9)}{cell(median(rows, 'copy_s'), 11)}"
                     f"{cell(median(rows, 'write_s'), 8)}{cell(step_s, 8)}{cell(during, 15)}"
                     f"{cell(during / step_s if during and step_s else None, 7, 2)}"
                     f"{median(rows, 'steps_in_write') or 0:>7.0f}")
    write_table(ROOT / "docs" / "bench" / "async_checkpoint.txt", lines)


if __name__ == "__main__":
    main()
