"""make test-gpu: the acceptance run for a machine with NVIDIA GPUs (docs/GPU.md, "Run it on your GPU machine").

    make test-gpu                                   # .venv-gpu's python (make install-gpu)
    python scripts/gpu_acceptance.py --out DIR      # in the image, or any venv with hvdkit's GPU flavour

Each check runs real jobs (horovodrun, hvdkit launch, the examples) in subprocesses
with a timeout, prints one line, and goes into DIR/gpu-acceptance.json, from which
docs/GPU.md's table is filled. The multi-rank checks run one rank per GPU (up to 8);
on one GPU they run with one rank, which shows the kernels but no transport between
GPUs. On a machine without a GPU it refuses in one line and exits 2: it never passes
there. Exit 1 when a check failed. The whole run stays under 10 minutes on one GPU
(each check's timeout is below).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MAX_RANKS = 8
ACCURACY = 0.8          # the Keras checks' floor on the digits data (0.935 on the H100 after 2 epochs)


def gpus() -> list[str]:
    """nvidia-smi's GPU lines ("GPU 0: NVIDIA H100 ... (UUID: GPU-...)"); none without the driver's tool."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    return [line for line in proc.stdout.splitlines() if line.startswith("GPU ")]


def run(argv: list[str], timeout: float, env: dict[str, str | None] | None = None) -> tuple[int, str, float]:
    """(exit status, stdout and stderr together, seconds); a timeout is status 124. ``env`` None values unset."""
    start = time.monotonic()
    merged = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={k: v for k, v in merged.items() if v is not None})
        return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return 124, out + f"\n(timed out after {timeout:.0f}s)", time.monotonic() - start


def last_json(text: str, marker: str = "{") -> dict:
    """The last JSON object in ``text`` that follows ``marker`` on its line (after MPI's output tags)."""
    for line in reversed(text.splitlines()):
        start = line.find(marker)
        if start >= 0:
            try:   # raw_decode: MPI's output tag of another line may follow on this one
                value, _ = json.JSONDecoder().raw_decode(line[start + len(marker) - 1:])
            except ValueError:
                continue
            if isinstance(value, dict) and value:
                return value
    return {}


def launch(np: int, code: str, timeout: float, env: dict[str, str | None] | None = None) -> tuple[int, str, float]:
    """`hvdkit launch -np N -- python -c CODE` on this machine."""
    return run([str(BIN / "hvdkit"), "launch", "-np", str(np), "--", sys.executable, "-c", REPORT + code],
               timeout, env)


# Every worker starts with this: rank 0 writes its result as JSON to the file the check names.
REPORT = """
import json as _json, os as _os


def report(result):
    with open(_os.environ["HVDKIT_GPU_CHECK_OUT"], "w") as f:
        _json.dump(result, f)
"""

NCCL_OPS = """
import json, time, torch, hvdkit.torch as hk
ctx = hk.init(); hvd = hk.hvd
t = torch.full((1 << 20,), float(ctx.rank + 1), device=ctx.device)
ok = bool((hvd.allreduce(t, op=hvd.Sum) == ctx.size * (ctx.size + 1) / 2).all())
ok &= bool((hvd.broadcast(t, root_rank=0) == 1).all())
ok &= hvd.allgather(t[:4]).tolist() == [float(r + 1) for r in range(ctx.size) for _ in range(4)]
big = torch.ones(16 << 20, device=ctx.device)   # 64 MiB
for _ in range(3): hvd.allreduce(big, op=hvd.Sum)
torch.cuda.synchronize(); start = time.perf_counter()
for _ in range(10): hvd.allreduce(big, op=hvd.Sum)
torch.cuda.synchronize(); ms = (time.perf_counter() - start) * 100
if ctx.rank == 0:
    report({"ok": ok, "size": ctx.size, "device": str(ctx.device),
                                          "allreduce_64mib_ms": ms})
"""

# Averages against the exact mean, in each dtype, through three paths: op=Average alone (NCCL's own average,
# ncclAvg: a pre-multiplied sum since NCCL 2.10), with prescale/postscale factors (Horovod's scaling kernel
# on one tensor, scale_buffer_*_k) and grouped (fused: the batched scaled copies in and out of the fusion
# buffer). The values are small integers, exact in every dtype; the factors 0.5 and 2 are exact too. What
# rounds: 1/N in the dtype, each rank's product with it and the N-1 sums, each within u (the unit roundoff)
# of at most max|v|: |error| <= (N + 2) u max|v| per element. A wrong kernel (bfloat16 read as float16, a
# missed tail, a factor applied twice) is off by whole units.
AVERAGE = """
import torch, hvdkit.torch as hk
ctx = hk.init(); hvd = hk.hvd
n = ctx.size
worst = {}
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    u = torch.finfo(dtype).eps / 2
    lengths = (17, 1000, (1 << 20) + 3)            # odd tails for the vectorised kernels, and a large tensor
    values = [[((torch.arange(m, dtype=torch.float64, device=ctx.device) * 7 + r * 13) % 31) - 15
               for m in lengths] for r in range(n)]
    exact = [sum(values[r][j] for r in range(n)) / n for j in range(len(lengths))]
    bound = [(n + 2) * u * torch.stack([values[r][j].abs() for r in range(n)]).amax(0) for j in range(len(lengths))]
    mine = [v.to(dtype) for v in values[ctx.rank]]
    paths = {
        "average": [hvd.allreduce(v, op=hvd.Average, name=f"avg.{dtype}.{j}") for j, v in enumerate(mine)],
        "scaled": [hvd.allreduce(v, op=hvd.Average, prescale_factor=0.5, postscale_factor=2.0,
                                 name=f"scaled.{dtype}.{j}") for j, v in enumerate(mine)],
        "grouped": hvd.grouped_allreduce(mine, op=hvd.Average, prescale_factor=0.5, postscale_factor=2.0,
                                         name=f"grouped.{dtype}"),
    }
    for path, got in paths.items():
        errors = [(g.double() - e).abs() for g, e in zip(got, exact)]
        # error / bound: at most 1 (an error where the bound is 0 reads huge)
        worst[f"{path}_{str(dtype).split('.')[-1]}"] = {
            "error_to_bound": max(float((err / b.clamp_min(1e-300)).max()) for err, b in zip(errors, bound)),
            "max_error": max(float(err.max()) for err in errors), "dtype_kept": all(g.dtype == dtype for g in got)}
if ctx.rank == 0:
    report({"size": n, "device": str(ctx.device), "paths": worst,
            "ok": all(w["error_to_bound"] <= 1 and w["dtype_kept"] for w in worst.values())})
"""

# fp16 and bf16 compression of float32 tensors (Horovod's Compression.fp16; patch item 17's Compression.bf16):
# random normal values, each rank's own. One more rounding than AVERAGE's (the compression of each value),
# and fp16's subnormal spacing where values are tiny: |error| <= (N + 3) (u max|v| + s/2), s the dtype's
# smallest subnormal.
COMPRESSION = """
import torch, hvdkit.torch as hk
ctx = hk.init(); hvd = hk.hvd
n = ctx.size
values = [torch.randn((1 << 20) + 3, generator=torch.Generator().manual_seed(r)) for r in range(n)]
exact = (sum(v.double() for v in values) / n).to(ctx.device)
peak = torch.stack([v.abs() for v in values]).amax(0).double().to(ctx.device)
mine = values[ctx.rank].to(ctx.device)
result = {}
for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
    info = torch.finfo(dtype)
    bound = (n + 3) * (info.eps / 2 * peak + info.smallest_normal * info.eps / 2)
    got = hvd.allreduce(mine, op=hvd.Average, compression=getattr(hvd.Compression, name), name=f"comp.{name}")
    err = (got.double() - exact).abs()
    result[name] = {"error_to_bound": float((err / bound).max()), "max_error": float(err.max()),
                    "dtype_kept": got.dtype == torch.float32}
if ctx.rank == 0:
    report({"size": n, "device": str(ctx.device), **result,
            "ok": all(r["error_to_bound"] <= 1 and r["dtype_kept"] for r in result.values())})
"""

# hk.DistributedOptimizer on N ranks against one process, same global batch (G samples, rank r takes its
# G/N), for each compression. Softmax regression on inputs in [-1, 1]: every per-sample gradient entry is at
# most 1, and the loss is convex with curvature at most L = (D + 1) / 2, so with lr <= 2/L a step of
# gradient descent never widens the distance between two runs (it is nonexpansive): their weights drift
# apart only by what their gradients differ, |dw| <= K lr sqrt(P) dg over K steps, P parameters. dg: each
# side's float32 sums over its batch, 2 (G + D) 2^-24 (Higham's bound, both sides), plus the compression,
# NCCL's average and the check's round trip, (N + 3) u gmax, gmax the largest shard-mean gradient entry.
# Summing instead of averaging moves the weights N - 1 times too far: far outside the bound for N >= 2.
REFERENCE = """
import copy, math, torch, torch.nn.functional as F, hvdkit.torch as hk
torch.backends.cuda.matmul.allow_tf32 = False   # TF32 would round to 2^-11: the bound assumes float32
ctx = hk.init(seed=0)
n, rank, dev = ctx.size, ctx.rank, ctx.device
G, D, C, K, LR = 840, 16, 10, 5, 0.05           # G divides by 1..8 ranks; LR * (D + 1) / 2 = 0.425 <= 2
gen = torch.Generator().manual_seed(0)
X = (torch.rand(K, G, D, generator=gen) * 2 - 1).to(dev)
Y = torch.randint(0, C, (K, G), generator=gen).to(dev)
lo, hi = rank * G // n, (rank + 1) * G // n
out = {}
for compression, u in (("none", 2.0 ** -24), ("fp16", 2.0 ** -11), ("bf16", 2.0 ** -8)):
    model = torch.nn.Linear(D, C).to(dev)
    opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), model=model, compression=compression)
    hk.broadcast_state(model, opt)
    ref = copy.deepcopy(model)
    start = [p.detach().clone() for p in model.parameters()]
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    gmax = 0.0
    for s in range(K):
        with torch.no_grad():          # each shard's mean gradient, what compression rounds
            err = torch.softmax(ref(X[s]), -1) - F.one_hot(Y[s], C)
            for r in range(n):
                a, b = r * G // n, (r + 1) * G // n
                gmax = max(gmax, float((err[a:b].T @ X[s, a:b] / (b - a)).abs().max()),
                           float(err[a:b].mean(0).abs().max()))
        opt.zero_grad()
        F.cross_entropy(model(X[s, lo:hi]), Y[s, lo:hi]).backward()
        opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(ref(X[s]), Y[s]).backward()
        ref_opt.step()
    P = sum(p.numel() for p in model.parameters())
    dg = 2 * (G + D) * 2.0 ** -24 + (n + 3) * u * gmax
    tolerance = K * LR * math.sqrt(P) * dg
    diff = max(float((p - q).abs().max()) for p, q in zip(model.parameters(), ref.parameters()))
    diff = float(hk.hvd.allreduce(torch.tensor([diff]), op=hk.hvd.Max, name=f"diff.{compression}"))
    moved = max(float((p - q).abs().max()) for p, q in zip(ref.parameters(), start))
    # The bound must also be tight enough to see a sum where an average belongs ((N - 1) times the move).
    out[compression] = {"max_diff": diff, "tolerance": tolerance, "moved": moved,
                        "ok": diff <= tolerance and (n == 1 or tolerance < (n - 1) * moved)}
if rank == 0:
    report({"size": n, "steps": K, "global_batch": G, **out, "ok": all(v["ok"] for v in out.values())})
"""

TORCH_AMP = """
import json, time, torch, torch.nn.functional as F, hvdkit.torch as hk
from hvdkit.examples.datasets import load_dataset
ctx = hk.init(seed=0); hvd = hk.hvd
data = load_dataset("digits", "data/mnist")
x = torch.as_tensor(data.x_train).float().reshape(-1, 1, 28, 28).to(ctx.device)
y = torch.as_tensor(data.y_train).long().to(ctx.device)
model = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(32 * 26 * 26, 10)).to(ctx.device)
opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=hk.scale_lr(0.05)), model=model)
hk.broadcast_state(model, opt)
scaler = torch.amp.GradScaler("cuda")
losses = []
start = time.perf_counter()
for step in range(60):
    i = torch.randint(0, len(x), (64,), device=ctx.device)
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = F.cross_entropy(model(x[i]), y[i])
    hk.step(opt, loss, scaler=scaler)
    losses.append(float(loss))
torch.cuda.synchronize()
# Every rank applied the same averaged, unscaled gradients (or skipped the same steps): equal weights.
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = hvd.allgather(flat[None], name="amp.weights")
if ctx.rank == 0:
    report({"size": ctx.size, "first_loss": losses[0], "last_loss": sum(losses[-10:]) / 10,
            "step_ms": (time.perf_counter() - start) / 60 * 1000, "scale": scaler.get_scale(),
            "ranks_agree": bool((gathered == gathered[0]).all())})
"""

# Keras 3 with mixed_float16 on the backend in {backend} (torch in the torch flavour, tensorflow in the TF one),
# one rank per GPU: 2 x size epochs over each rank's 1/size of the data, as many steps as one rank's 2 epochs.
KERAS_AMP = """
import json, os
os.environ["KERAS_BACKEND"] = "{backend}"
import hvdkit.keras as hk
import keras
from hvdkit.examples.datasets import load_dataset
ctx = hk.init(seed=0)
keras.mixed_precision.set_global_policy("mixed_float16")
data = load_dataset("digits", "data/mnist")
x, y = hk.shard_arrays(data.x_train.reshape(-1, 28, 28, 1).astype("float32"), data.y_train)
model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(32, 3, activation="relu"),
                          keras.layers.Flatten(), keras.layers.Dense(10),
                          keras.layers.Activation("softmax", dtype="float32")])
model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.Adam(hk.scale_lr(0.001))),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=2 * ctx.size, verbose=0, callbacks=hk.callbacks())
if ctx.rank == 0:
    report({"size": ctx.size, "accuracy": float(history.history["accuracy"][-1]),
                      "policy": keras.mixed_precision.global_policy().name,
                      "device": str(next(iter(model.trainable_variables)).value.device)})
"""

# The TensorFlow flavour's NCCL path: horovod.tensorflow's collectives on GPU tensors.
TF_NCCL_OPS = """
import time, tensorflow as tf, hvdkit.keras as hk
ctx = hk.init(); hvd = hk.hvd
with tf.device("/GPU:0"):
    t = tf.fill([1 << 20], float(ctx.rank + 1))
    s = hvd.allreduce(t, op=hvd.Sum)
    ok = bool(tf.reduce_all(s == ctx.size * (ctx.size + 1) / 2))
    ok &= bool(tf.reduce_all(hvd.broadcast(t, root_rank=0) == 1))
    ok &= hvd.allgather(t[:4]).numpy().tolist() == [float(r + 1) for r in range(ctx.size) for _ in range(4)]
    big = tf.ones([16 << 20])   # 64 MiB
    for _ in range(3): hvd.allreduce(big, op=hvd.Sum).numpy()
    start = time.perf_counter()
    for _ in range(10): r = hvd.allreduce(big, op=hvd.Sum)
    r.numpy(); ms = (time.perf_counter() - start) * 100
if ctx.rank == 0:
    report({"ok": ok, "size": ctx.size, "device": s.device, "allreduce_64mib_ms": ms})
"""

# AVERAGE in the TensorFlow flavour (its own Horovod build, CUDA 12): the same paths, values and bound.
TF_AVERAGE = """
import numpy as np, tensorflow as tf, hvdkit.keras as hk
ctx = hk.init(); hvd = hk.hvd
n = ctx.size
worst = {}
with tf.device("/GPU:0"):
    for dtype, u in ((tf.float32, 2.0 ** -24), (tf.float16, 2.0 ** -11), (tf.bfloat16, 2.0 ** -8)):
        lengths = (17, 1000, (1 << 20) + 3)
        values = [[((np.arange(m, dtype=np.float64) * 7 + r * 13) % 31) - 15 for m in lengths] for r in range(n)]
        exact = [sum(values[r][j] for r in range(n)) / n for j in range(len(lengths))]
        bound = [(n + 2) * u * np.max([np.abs(values[r][j]) for r in range(n)], 0) for j in range(len(lengths))]
        mine = [tf.cast(tf.constant(v), dtype) for v in values[ctx.rank]]
        paths = {
            "average": [hvd.allreduce(v, op=hvd.Average, name=f"avg_{dtype.name}_{j}") for j, v in enumerate(mine)],
            "scaled": [hvd.allreduce(v, op=hvd.Average, prescale_factor=0.5, postscale_factor=2.0,
                                     name=f"scaled_{dtype.name}_{j}") for j, v in enumerate(mine)],
            "grouped": hvd.grouped_allreduce(mine, op=hvd.Average, prescale_factor=0.5, postscale_factor=2.0),
        }
        for path, got in paths.items():
            errors = [np.abs(tf.cast(g, tf.float64).numpy() - e) for g, e in zip(got, exact)]
            worst[f"{path}_{dtype.name}"] = {
                "error_to_bound": max(float((err / np.maximum(b, 1e-300)).max()) for err, b in zip(errors, bound)),
                "max_error": max(float(err.max()) for err in errors),
                "dtype_kept": all(g.dtype == dtype for g in got), "device": got[0].device}
if ctx.rank == 0:
    report({"size": n, "paths": worst, "ok": all(w["error_to_bound"] <= 1 and w["dtype_kept"] and "GPU" in w["device"]
                                                 for w in worst.values())})
"""

TORCH_COMPILE = """
import json, time, torch, torch.nn.functional as F, hvdkit.torch as hk
ctx = hk.init(seed=0)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10)).to(ctx.device)
opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model=model)
hk.broadcast_state(model, opt)
compiled = torch.compile(model)
x, y = torch.randn(256, 512, device=ctx.device), torch.randint(0, 10, (256,), device=ctx.device)
start = time.perf_counter()
for step in range(20):
    opt.zero_grad()
    F.cross_entropy(compiled(x), y).backward()
    opt.step()
torch.cuda.synchronize()
if ctx.rank == 0:
    report({"size": ctx.size, "loss": float(F.cross_entropy(compiled(x), y)),
                                          "seconds_with_compile": time.perf_counter() - start})
"""

# The 64 MiB allreduce the bus-bandwidth floor is judged on, in each flavour (rank 0's mean of 10 after 3).
BUSBW_TORCH = """
import time, torch, hvdkit.torch as hk
ctx = hk.init(); hvd = hk.hvd
big = torch.ones(16 << 20, device=ctx.device)   # 64 MiB of float32
for _ in range(3): hvd.allreduce(big, op=hvd.Sum, name="busbw")
torch.cuda.synchronize(); start = time.perf_counter()
for _ in range(10): hvd.allreduce(big, op=hvd.Sum, name="busbw")
torch.cuda.synchronize()
if ctx.rank == 0:
    report({"size": ctx.size, "nbytes": big.numel() * 4, "seconds": (time.perf_counter() - start) / 10})
"""

BUSBW_TF = """
import time, tensorflow as tf, hvdkit.keras as hk
ctx = hk.init(); hvd = hk.hvd
with tf.device("/GPU:0"):
    big = tf.ones([16 << 20])   # 64 MiB of float32
    for _ in range(3): hvd.allreduce(big, op=hvd.Sum, name="busbw").numpy()
    start = time.perf_counter()
    for _ in range(10): hvd.allreduce(big, op=hvd.Sum, name="busbw").numpy()
if ctx.rank == 0:
    report({"size": ctx.size, "nbytes": 16 << 22, "seconds": (time.perf_counter() - start) / 10})
"""

SHARED = "import hvdkit.torch as hk; hk.init()"

# Every snippet a check launches (tests/cli/test_gpu_acceptance.py compiles each).
SNIPPETS = {"NCCL_OPS": NCCL_OPS, "AVERAGE": AVERAGE, "COMPRESSION": COMPRESSION, "REFERENCE": REFERENCE,
            "TORCH_AMP": TORCH_AMP, "KERAS_AMP": KERAS_AMP, "TF_NCCL_OPS": TF_NCCL_OPS, "TF_AVERAGE": TF_AVERAGE,
            "TORCH_COMPILE": TORCH_COMPILE, "BUSBW_TORCH": BUSBW_TORCH, "BUSBW_TF": BUSBW_TF, "SHARED": SHARED}


@dataclass(frozen=True)
class Check:
    """One line of the run: ``run()`` launches ``ranks`` processes; ``flavour`` None runs in either flavour."""

    name: str
    flavour: str | None
    ranks: int
    run: Callable[[], dict]


# A background checkpoint from the GPU: save_checkpoint(blocking=False) copies into pinned host memory and returns;
# the weights changed right after must not reach the file (the copy was synchronised before the return).
ASYNC_SAVE = """
import os, tempfile, time, torch, hvdkit.torch as hk
from hvdkit.torch.tensors import host_copy
ctx = hk.init()
model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(16)]).to(ctx.device)   # 256 MiB
optimizer = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
hk.broadcast_state(model, optimizer)
before = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
pinned = all(t.is_pinned() for t in host_copy(model.state_dict()).values())
path = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
start = time.perf_counter()
hk.save_checkpoint(path, model, optimizer, blocking=False)
blocked = time.perf_counter() - start
with torch.no_grad():
    for p in model.parameters():
        p.add_(1.0)                      # on the GPU, right after the return
hk.wait_for_checkpoint()
saved = torch.load(path, map_location="cpu", weights_only=True)["model"] if ctx.rank == 0 else before
same = all(torch.equal(saved[k], before[k]) for k in before)
if ctx.rank == 0:
    report({"ok": pinned and same, "pinned": pinned, "file_holds_the_weights_at_the_save": same,
            "blocked_ms": round(blocked * 1e3, 1), "size": ctx.size})
"""


def check_env() -> dict:
    status, out, _ = run([str(BIN / "hvdkit"), "env", "--json"], 120)
    try:                       # indented JSON over many lines, after any warning lines
        report = json.loads(out[out.index("{"):out.rindex("}") + 1])
    except ValueError:
        report = {}
    horovod = report.get("horovod") or {}
    nccl = (horovod.get("tensor_operations") or {}).get("nccl")
    return {"ok": status == 0 and bool(nccl) and bool(report.get("gpus")), "nccl_version": horovod.get("nccl_version"),
            "cuda_arches": horovod.get("cuda_arches"), "torch_cuda": report.get("torch_cuda"),
            "tensorflow_cuda": report.get("tensorflow_cuda"),
            "env_gpus": report.get("gpus"), "report": report}


def check_job(code: str, np: int, timeout: float, expect: Callable[[dict], bool],
              env: dict[str, str | None] | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "result.json"
        status, out, seconds = launch(np, code, timeout, env={**(env or {}), "HVDKIT_GPU_CHECK_OUT": str(path)})
        result = json.loads(path.read_text()) if path.exists() else {}
    ok = status == 0 and bool(result) and bool(expect(result))
    return {"ok": ok, "seconds": round(seconds, 1), **result, **({} if ok else {"output": out[-3000:]})}


def check_busbw(code: str, np: int, floors: dict[str, float] | None) -> dict:
    """The 64 MiB allreduce with NCCL's transport lines: the transport against `nvidia-smi topo -m`, the bus
    bandwidth against its floor (hvdkit.ops.gpu_topology, unit-tested on recorded outputs)."""
    from hvdkit.ops import gpu_topology

    _, topo_text, _ = run([shutil.which("nvidia-smi") or "nvidia-smi", "topo", "-m"], 60)
    topo = gpu_topology.parse_topology(topo_text)        # UserError: a failed check, with the reason
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "result.json"
        # INIT carries every transport line (INFO(NCCL_INIT|NCCL_P2P, ...)); the file setting would take them away.
        job, out, seconds = launch(np, code, 180, env={"HVDKIT_GPU_CHECK_OUT": str(path), "NCCL_DEBUG": "INFO",
                                                        "NCCL_DEBUG_SUBSYS": "INIT", "NCCL_DEBUG_FILE": None})
        result = json.loads(path.read_text()) if path.exists() else {}
    log = gpu_topology.parse_nccl_log(out)
    verdict = gpu_topology.judge(topo, log, ranks=np, nbytes=result.get("nbytes"), seconds=result.get("seconds"),
                                 floors=floors)
    ok = job == 0 and bool(result) and verdict.ok
    return {"ok": ok, "seconds": round(seconds, 1), "ranks": np, "nccl": log.version, "nvls": log.nvls,
            "allreduce_64mib_ms": round(result["seconds"] * 1e3, 3) if result else None, **verdict.summary(),
            "topo": topo_text.strip().splitlines()[:MAX_RANKS + 1], **({} if ok else {"output": out[-3000:]})}


def check_input_wait() -> dict:
    out_dir = ROOT / "build" / "gpu-bench"
    status, out, seconds = run([str(BIN / "hvdkit"), "bench", "train", "-np", "1", "--models", "resnet50",
                                "--impls", "hvdkit", "--repeats", "1", "--steps", "20", "--image-size", "224",
                                "--out", str(out_dir), "--json"], 420)
    rows = last_json(out).get("rows", [])
    share = rows[0].get("input_share") if rows else None
    return {"ok": status == 0 and share is not None and share < 0.05, "input_share": share,
            "step_ms": rows[0].get("step_ms") if rows else None, "seconds": round(seconds, 1),
            **({} if status == 0 else {"output": out[-3000:]})}


def check_sharing() -> dict:
    # Two ranks shown one GPU: hvdkit's slots error, not an NCCL crash.
    status, out, seconds = launch(2, SHARED, 180, env={"CUDA_VISIBLE_DEVICES": "0"})
    ok = status != 0 and "local rank 1 has no GPU" in out
    return {"ok": ok, "seconds": round(seconds, 1), **({} if ok else {"output": out[-3000:]})}


def check_keras_example(np: int) -> dict:
    """examples/keras_mnist.py unmodified on ``np`` ranks, the flavour's backend (the image's KERAS_BACKEND, else
    what imports). In the TensorFlow flavour Keras leaves jit_compile on "auto", which a GPU turns into XLA: the
    example must train with it and without a `hvdkit:` warning (a correct script gets none)."""
    status, out, seconds = run([str(BIN / "hvdkit"), "launch", "-np", str(np), "--", sys.executable,
                                "examples/keras_mnist.py", "--epochs", "2", "--json"], 300)
    result = last_json(out)
    warnings = [line for line in out.replace("hvdkit launch", "").splitlines() if "hvdkit: " in line]
    ok = status == 0 and result.get("test_accuracy", 0) > ACCURACY and not warnings
    return {"ok": ok, **result, "ranks": np, "seconds": round(seconds, 1),
            **({"warnings": warnings[:5]} if warnings else {}), **({} if ok else {"output": out[-3000:]})}


def installed(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, timeout=120).returncode == 0


def plan(np: int, floors: dict[str, float] | None = None) -> list[Check]:
    """Every check for ``np`` GPUs, in order, each flavour's own tagged: one rank per GPU for the multi-rank
    paths (one rank on one GPU), the Keras example on 2 ranks where there are 2 GPUs."""
    amp = KERAS_AMP.replace("{backend}", "torch"), KERAS_AMP.replace("{backend}", "tensorflow")
    return [
        Check("env", None, 0, check_env),
        Check("nccl_collectives", "torch", np, lambda: check_job(
            NCCL_OPS, np, 180, lambda r: r.get("ok") and r.get("size") == np and r["device"].startswith("cuda"))),
        Check("allreduce_average", "torch", np, lambda: check_job(
            AVERAGE, np, 180, lambda r: r.get("ok") and r.get("size") == np)),
        Check("compression_fp16_bf16", "torch", np, lambda: check_job(
            COMPRESSION, np, 180, lambda r: r.get("ok") and r.get("size") == np)),
        Check("optimizer_vs_one_rank", "torch", np, lambda: check_job(
            REFERENCE, np, 180, lambda r: r.get("ok") and r.get("size") == np)),
        Check("torch_amp", "torch", np, lambda: check_job(
            TORCH_AMP, np, 180, lambda r: r["last_loss"] < r["first_loss"] and r["ranks_agree"] and r["size"] == np)),
        Check("keras_torch_mixed_float16", "torch", np, lambda: check_job(
            amp[0], np, 300, lambda r: r["accuracy"] > ACCURACY and "cuda" in r["device"] and r["size"] == np)),
        Check("torch_compile", "torch", np, lambda: (
            check_job(TORCH_COMPILE, np, 300, lambda r: r["loss"] == r["loss"] and r["size"] == np)
            if shutil.which("cc") or shutil.which("gcc") else
            {"ok": None, "note": "no C compiler: Triton compiles a launcher at run time; the runtime image has "
                                 "none (docs/GPU.md, item 8)"})),
        Check("async_checkpoint", "torch", np, lambda: check_job(
            ASYNC_SAVE, np, 180, lambda r: r.get("ok") and r.get("size") == np)),
        Check("input_wait_resnet50", "torch", 1, check_input_wait),
        Check("two_ranks_one_gpu", "torch", 2, check_sharing),
        Check("nccl_busbw_64mib", "torch", np, lambda: check_busbw(BUSBW_TORCH, np, floors)),
        Check("tf_nccl_collectives", "tensorflow", np, lambda: check_job(
            TF_NCCL_OPS, np, 240, lambda r: r.get("ok") and r.get("size") == np and "GPU" in r["device"])),
        Check("tf_allreduce_average", "tensorflow", np, lambda: check_job(
            TF_AVERAGE, np, 240, lambda r: r.get("ok") and r.get("size") == np)),
        Check("keras_tensorflow_mixed_float16", "tensorflow", np, lambda: check_job(
            amp[1], np, 300, lambda r: r["accuracy"] > ACCURACY and "GPU" in r["device"] and r["size"] == np)),
        Check("tf_nccl_busbw_64mib", "tensorflow", np, lambda: check_busbw(BUSBW_TF, np, floors)),
        Check("keras_example", None, min(np, 2), lambda: check_keras_example(min(np, 2))),
    ]


def floor_option(text: str) -> tuple[str, float]:
    """--busbw-floor nvlink=30: one class's floor in GB/s (the class is checked once hvdkit is imported)."""
    name, _, value = text.partition("=")
    try:
        return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give CLASS=GBPS, e.g. nvlink=30") from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "build"), help="where gpu-acceptance.json goes (default build/)")
    parser.add_argument("--busbw-floor", type=floor_option, action="append", default=[], metavar="CLASS=GBPS",
                        help="override a bus-bandwidth floor (hvdkit/ops/gpu_topology.py: nvlink, pcie_p2p, shm)")
    args = parser.parse_args()
    found = gpus()
    if not found:
        print("make test-gpu: no NVIDIA GPU here (nvidia-smi lists none): it is the acceptance run for a GPU "
              "machine, see docs/GPU.md", file=sys.stderr)
        return 2
    if not (BIN / "hvdkit").exists():
        print(f"make test-gpu: no hvdkit beside {sys.executable}: run make install-gpu (.venv-gpu) or make "
              f"install-gpu-tf (.venv-gpu-tf) first, or run this script with the image's python", file=sys.stderr)
        return 2
    from hvdkit.ops.gpu_topology import BUSBW_FLOOR_GBPS  # hvdkit is installed beside this python (checked above)

    floors = {**BUSBW_FLOOR_GBPS, **dict(args.busbw_floor)}
    if set(floors) != set(BUSBW_FLOOR_GBPS):
        parser.error(f"--busbw-floor takes {', '.join(BUSBW_FLOOR_GBPS)}, "
                     f"not {', '.join(sorted(set(floors) - set(BUSBW_FLOOR_GBPS)))}")
    np = min(len(found), MAX_RANKS)
    # Each flavour's own checks: torch's (install.sh --gpu) or TensorFlow's (--gpu-tf); the other's are "not run".
    flavour = "tensorflow" if not installed("torch") and installed("tensorflow") else "torch"
    other = {"ok": None, "note": f"not in this flavour ({flavour}): run it in the other flavour's venv or image"}
    results = {"gpus": found, "flavour": flavour, "ranks": np, "python": sys.version.split()[0],
               "busbw_floors_gbps": floors,
               "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    for check in plan(np, floors):
        try:
            result = check.run() if check.flavour in (None, flavour) else other
        except Exception as exc:     # a check that breaks is a failed check, with its reason recorded
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        results[check.name] = result
        word = {True: "ok", False: "FAILED", None: "not run"}[result["ok"]]
        shown = {k: v for k, v in result.items() if k not in ("ok", "output", "report", "gpus", "topo", "paths")}
        print(f"{check.name:30s} {word:8s} {json.dumps(shown)[:200]}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-acceptance.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out / 'gpu-acceptance.json'}")
    return 1 if any(isinstance(r, dict) and r.get("ok") is False for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
