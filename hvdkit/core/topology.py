"""Where a process sits in a Horovod job, independent of the framework.

Each adapter's ``init()`` returns a subclass that adds its device in the
framework's own type (``torch.device``, or a TensorFlow device string).

Example::

    ctx = hvdkit.torch.init()
    if ctx.is_main:
        print(f"{ctx.size} processes on {ctx.cross_size} hosts")
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    gpu: int | None = None      # the GPU index this process pinned (among the visible ones); None on CPU

    @property
    def is_main(self) -> bool:
        """True on rank 0, the rank that logs, evaluates summaries and writes checkpoints."""
        return self.rank == 0

    @property
    def verbose(self) -> int:
        """Keras ``verbose=``: one line per epoch on rank 0 (2; a redrawn bar is garbled under
        horovodrun, which pipes and prefixes every line), nothing on the others (0)."""
        return 2 if self.rank == 0 else 0


def cpu_threads_per_rank(local_size: int) -> int | None:
    """Intra-op threads per process so a host's ranks share its cores instead of oversubscribing.

    None when the user set OMP_NUM_THREADS (their choice wins).
    """
    if "OMP_NUM_THREADS" in os.environ:
        return None
    return share_of_cores(local_size)


def share_of_cores(local_size: int) -> int:
    """This host's cores divided among its ``local_size`` processes (at least 1)."""
    return max(1, (os.cpu_count() or 1) // max(local_size, 1))


class NoGPUError(RuntimeError):
    """This host runs more processes than it has visible GPUs."""


def gpu_for_local_rank(local_rank: int, local_size: int, visible: int, cuda_visible_devices: str | None) -> int:
    """The GPU index (among the visible ones) that local rank ``local_rank`` pins: its own number.

    Both adapters call this with the framework's visible-device count, which
    CUDA_VISIBLE_DEVICES has already filtered.

    Example::

        gpu_for_local_rank(1, 4, visible=4, cuda_visible_devices=None)   # 1
    """
    if local_rank >= visible:
        raise NoGPUError(
            f"local rank {local_rank} has no GPU: this host runs {local_size} processes but {visible} GPU(s) are "
            f"visible (CUDA_VISIBLE_DEVICES={cuda_visible_devices if cuda_visible_devices is not None else 'unset'}); "
            f"lower the host's slots to {visible} in -H/--hostfile or expose more GPUs"
        )
    return local_rank
