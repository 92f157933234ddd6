"""make test-gpu: the acceptance run for a machine with NVIDIA GPUs (docs/GPU.md, "Not yet verified").

    make test-gpu                                   # .venv-gpu's python (make install-gpu)
    python scripts/gpu_acceptance.py --out DIR      # in the image, or any venv with hvdkit's GPU flavour

Each check runs real jobs (horovodrun, hvdkit launch, the examples) in subprocesses
with a timeout, prints one line, and goes into DIR/gpu-acceptance.json, from which
docs/GPU.md's table is filled. On a machine without a GPU it refuses in one line and
exits 2: it never passes there. Exit 1 when a check failed. The whole run stays under
10 minutes on one GPU (each check's timeout is below).
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def gpus() -> list[str]:
    """nvidia-smi's GPU lines ("GPU 0: NVIDIA H100 ... (UUID: GPU-...)"); none without the driver's tool."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    return [line for line in proc.stdout.splitlines() if line.startswith("GPU ")]


def run(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """(exit status, stdout and stderr together, seconds); a timeout is status 124."""
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
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


def launch(np: int, code: str, timeout: float, env: dict[str, str] | None = None) -> tuple[int, str, float]:
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

TORCH_AMP = """
import json, time, torch, torch.nn.functional as F, hvdkit.torch as hk
from hvdkit.examples.datasets import load_dataset
ctx = hk.init(seed=0)
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
if ctx.rank == 0:
    report({"first_loss": losses[0], "last_loss": sum(losses[-10:]) / 10,
                      "step_ms": (time.perf_counter() - start) / 60 * 1000, "scale": scaler.get_scale()})
"""

# Keras 3 with mixed_float16 on the backend in {backend} (torch in the torch flavour, tensorflow in the TF one).
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
history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=hk.callbacks())
if ctx.rank == 0:
    report({"accuracy": float(history.history["accuracy"][-1]),
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
    report({"loss": float(F.cross_entropy(compiled(x), y)),
                                          "seconds_with_compile": time.perf_counter() - start})
"""

SHARED = "import hvdkit.torch as hk; hk.init()"


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


def check_job(code: str, np: int, timeout: float, expect: callable) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "result.json"
        status, out, seconds = launch(np, code, timeout, env={"HVDKIT_GPU_CHECK_OUT": str(path)})
        result = json.loads(path.read_text()) if path.exists() else {}
    ok = status == 0 and bool(result) and bool(expect(result))
    return {"ok": ok, "seconds": round(seconds, 1), **result, **({} if ok else {"output": out[-3000:]})}


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


def check_keras_example() -> dict:
    """examples/keras_mnist.py unmodified: the flavour's backend (the image's KERAS_BACKEND, else what imports)."""
    status, out, seconds = run([str(BIN / "hvdkit"), "launch", "-np", "1", "--", sys.executable,
                                "examples/keras_mnist.py", "--epochs", "1", "--json"], 300)
    result = last_json(out)
    return {"ok": status == 0 and result.get("test_accuracy", 0) > 0.8, **result, "seconds": round(seconds, 1),
            **({} if status == 0 else {"output": out[-3000:]})}


def installed(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, timeout=120).returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "build"), help="where gpu-acceptance.json goes (default build/)")
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
    np = min(len(found), 8)
    # Each flavour's own checks: torch's (install.sh --gpu) or TensorFlow's (--gpu-tf); the other's are "not run".
    flavour = "tensorflow" if not installed("torch") and installed("tensorflow") else "torch"
    other = {"ok": None, "note": f"not in this flavour ({flavour}): run it in the other flavour's venv or image"}
    torch_checks = {
        "nccl_collectives": lambda: check_job(NCCL_OPS, np, 180, lambda r: r.get("ok") and r.get("size") == np
                                                and r["device"].startswith("cuda")),
        "torch_amp": lambda: check_job(TORCH_AMP, 1, 180, lambda r: r["last_loss"] < r["first_loss"]),
        "keras_torch_mixed_float16": lambda: check_job(KERAS_AMP.replace("{backend}", "torch"), 1, 240,
                                                         lambda r: r["accuracy"] > 0.8 and "cuda" in r["device"]),
        "torch_compile": lambda: (check_job(TORCH_COMPILE, 1, 240, lambda r: r["loss"] == r["loss"])
                                  if shutil.which("cc") or shutil.which("gcc") else
                                  {"ok": None, "note": "no C compiler: Triton compiles a launcher at run time; the "
                                                       "runtime image has none (docs/GPU.md, item 8)"}),
        "input_wait_resnet50": check_input_wait,
        "two_ranks_one_gpu": check_sharing,
    }
    tf_checks = {
        "tf_nccl_collectives": lambda: check_job(TF_NCCL_OPS, np, 240, lambda r: r.get("ok") and r.get("size") == np
                                                   and "GPU" in r["device"]),
        "keras_tensorflow_mixed_float16": lambda: check_job(KERAS_AMP.replace("{backend}", "tensorflow"), 1, 300,
                                                              lambda r: r["accuracy"] > 0.8 and "GPU" in r["device"]),
    }
    checks = {"env": check_env,
              **{name: (check if flavour == "torch" else lambda: other) for name, check in torch_checks.items()},
              **{name: (check if flavour == "tensorflow" else lambda: other) for name, check in tf_checks.items()},
              "keras_example": check_keras_example}
    results = {"gpus": found, "flavour": flavour, "python": sys.version.split()[0],
               "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    for name, check in checks.items():
        try:
            result = check()
        except Exception as exc:     # a check that breaks is a failed check, with its reason recorded
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        results[name] = result
        word = {True: "ok", False: "FAILED", None: "not run"}[result["ok"]]
        shown = {k: v for k, v in result.items() if k not in ("ok", "output", "report", "gpus")}
        print(f"{name:28s} {word:8s} {json.dumps(shown)[:200]}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-acceptance.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out / 'gpu-acceptance.json'}")
    return 1 if any(isinstance(r, dict) and r.get("ok") is False for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
