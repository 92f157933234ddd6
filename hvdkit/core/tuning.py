"""The Horovod settings hvdkit's ``init()`` sets when the user has not, and why.

Each value comes from ``hvdkit bench`` runs recorded in docs/BENCHMARKS.md.
Anything already in the environment (``HOROVOD_CYCLE_TIME=...``, or
horovodrun's ``--cycle-time-ms``, which sets the same variable) wins.

Example::

    apply_horovod_defaults()      # before hvd.init(); returns what it set
"""

from __future__ import annotations

import os

# Horovod's background thread wakes every cycle (default 1 ms in 0.28) to
# agree with the other ranks on which tensors are ready, so an allreduce
# waits for a cycle before it starts. Measured on 2 processes (hvdkit bench
# allreduce, two runs each): 1 MiB went from 0.67 GB/s bus bandwidth at 1 ms
# to 1.05-3.04 at 0.1 ms, 16 MiB from 1.97-2.56 to 2.16-3.03, and ResNet-50's
# 161 gradients from 83-90 ms to 68-74 ms. A backward pass's gradients still
# gather into fused buffers at 0.1 ms; the cost is a little CPU while idle.
CYCLE_TIME_MS = "0.1"

# Left at Horovod's default (128 MiB): ResNet-50's 97.5 MiB of fp32 gradients
# fit in one fused buffer, and the many-tensors bench showed no gain from
# smaller buffers. Named here so the choice is visible.
FUSION_THRESHOLD_BYTES = None


def horovod_defaults() -> dict[str, str]:
    """The HOROVOD_* variables hvdkit would set, before looking at the environment."""
    env = {"HOROVOD_CYCLE_TIME": CYCLE_TIME_MS}
    if FUSION_THRESHOLD_BYTES is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(FUSION_THRESHOLD_BYTES)
    return env


def apply_horovod_defaults(environ=os.environ) -> dict[str, str]:
    """Set each default the environment does not already have; return what was set."""
    applied = {}
    for key, value in horovod_defaults().items():
        if key not in environ:
            environ[key] = applied[key] = value
    return applied
