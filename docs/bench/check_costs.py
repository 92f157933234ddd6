"""What the everyday-path checks cost (docs/RELIABILITY.md, docs/ADAPTERS.md): run on 2 ranks.

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python docs/bench/check_costs.py

- the non-finite gradient check (hk.DistributedOptimizer's check_finite, on by default): the training
  step's median with it on and off, interleaved, for the example's convnet and ResNet-50 (64x64 images);
- the first step's unsharded-loader check (torch; once a job) and the Keras fit-data fingerprint
  (at fit's start) on MNIST-sized arrays, 60,000 x 784 float32.
"""

import platform
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import hvdkit.torch as hk
from hvdkit.bench.models import MnistNet, ResNet50
from hvdkit.runtime.datacheck import rows_fingerprint
from hvdkit.torch.data import _samples_digest, _whole_dataset_in_use

ctx = hk.init(seed=0)
log = print if ctx.rank == 0 else (lambda *a, **k: None)


def step_times(make, shape, batch, check, steps):
    model = make()
    opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), model,
                                  check_finite=check)
    hk.broadcast_state(model, opt)
    x, y = torch.randn(batch, *shape), torch.randint(0, 10, (batch,))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return times[2:]                       # the first steps warm up (and run the one-time checks)


def finite_check_cost(name, make, shape, batch, steps, repeats):
    on, off = [], []
    for _ in range(repeats):               # interleaved, so drift in the machine's load hits both
        off += step_times(make, shape, batch, False, steps)
        on += step_times(make, shape, batch, True, steps)
    m_on, m_off = statistics.median(on), statistics.median(off)
    log(f"{name:10} step median: check_finite=False {1e3 * m_off:8.2f} ms, True {1e3 * m_on:8.2f} ms "
        f"({100 * (m_on / m_off - 1):+.1f}%), {len(on)} steps each")


log(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads per rank, {ctx.size} ranks, "
    f"torch {torch.__version__}")
finite_check_cost("convnet", MnistNet, (1, 28, 28), 32, 30, 5)
finite_check_cost("resnet50", lambda: ResNet50(num_classes=10), (3, 64, 64), 8, 8, 3)

data = TensorDataset(torch.randn(60000, 1, 28, 28), torch.randint(0, 10, (60000,)))
loader = DataLoader(data, batch_size=32, shuffle=True)
it = iter(loader)
next(it)
start = time.perf_counter()
_samples_digest(_whole_dataset_in_use())
log(f"unsharded-loader check (once, first step): {1e3 * (time.perf_counter() - start):.1f} ms")
x = np.random.default_rng(0).standard_normal((60000, 784)).astype("float32")
y = np.arange(60000) % 10
start = time.perf_counter()
rows_fingerprint([x, y])
log(f"Keras fit-data fingerprint, 60000 x 784 float32 + labels (each fit's start): "
    f"{1e3 * (time.perf_counter() - start):.1f} ms")
