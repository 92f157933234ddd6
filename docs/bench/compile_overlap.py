"""When do gradients become ready in backward, eager against torch.compile? (docs/ADAPTERS.md, torch.compile)

Horovod starts each gradient's allreduce from a hook on its accumulator, so the time the first
gradient is ready is when communication can begin to overlap backward's compute. Run:

    .venv/bin/python docs/bench/compile_overlap.py      # one thread, an 8-layer 1024-wide MLP, batch 256
"""

import platform
import time

import torch
import torch.nn as nn


def run(compiled: bool) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()) for _ in range(8)])
    ready = {}
    accumulators = []                  # keep them alive: a hook lives on its accumulator node
    for name, p in model.named_parameters():
        acc = p.expand_as(p).grad_fn.next_functions[0][0]
        acc.register_hook(lambda *_, name=name: ready.setdefault(name, time.perf_counter()) and None)
        accumulators.append(acc)
    run_model = torch.compile(model) if compiled else model
    x = torch.randn(256, 1024)
    for _ in range(3):                 # the last of 3 (the first compiles)
        ready.clear()
        model.zero_grad()
        loss = run_model(x).sum()
        start = time.perf_counter()
        loss.backward()
        end = time.perf_counter()
    first, last = min(ready.values()) - start, max(ready.values()) - start
    return (f"{'compiled' if compiled else 'eager':8}: backward {1e3 * (end - start):.1f} ms; first gradient ready at "
            f"{1e3 * first:.1f} ms, last at {1e3 * last:.1f} ms")


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, 1 thread")
    print(run(False))
    print(run(True))
