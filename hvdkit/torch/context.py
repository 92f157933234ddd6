"""Steps 1 and 2: initialise Horovod and pin this process to its device (the core does it; torch's backend).

Example::

    import hvdkit.torch as hk
    ctx = hk.init(seed=42)
    model = Net().to(ctx.device)
"""

from __future__ import annotations

from hvdkit.backends.torch import TorchBackend
from hvdkit.runtime import context
from hvdkit.runtime.context import Context, refresh, seed_everything

ADAPTER = "hvdkit.torch"


def init(seed: int | None = None, threads: int | None = None) -> Context:
    """Initialise Horovod, pin this rank's own GPU (or use the CPU), set threads and seeds.

    ``ctx.device`` is a ``torch.device``. What it does, in order, is
    :func:`hvdkit.runtime.context.init`'s: the GPU is the local rank's unless the
    launcher gave each rank its own, after the ranks compared UUIDs;
    ``threads`` defaults to the host's cores shared among its ranks;
    ``seed`` seeds Python, numpy and torch with ``seed`` on every rank, so a
    shuffle or ``random_split`` before sharding agrees across ranks
    (:func:`seed_everything`; ``per_rank=True`` there for per-rank streams).
    """
    return context.init(TorchBackend(), "torch", adapter=ADAPTER, seed=seed, threads=threads)


def current() -> Context:
    """The context made by :func:`init`; a clear error if it was not called."""
    return context.current(ADAPTER)


__all__ = ["ADAPTER", "Context", "current", "init", "refresh", "seed_everything"]
