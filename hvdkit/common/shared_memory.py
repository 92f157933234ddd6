"""/dev/shm on a GPU host: NCCL's shared-memory transport and DataLoader workers both live in it.

Docker gives a container 64 MiB of ``/dev/shm`` unless it is started with
``--ipc=host`` or ``--shm-size``. NCCL's transport between the GPUs of one host
then fails to extend its segments, and DataLoader workers die with a bus error
when their batches do not fit. ``hk.init()`` (on a pinned GPU) and ``hvdkit
doctor`` (on a host with GPUs) read its size here and print one line naming the
fix; CPU jobs are never warned.

Example::

    shm_bytes()                               # 67108864 in a plain `docker run`
    small_shm_warning(64 << 20)               # "hvdkit: /dev/shm is 64 MiB, ... --ipc=host or --shm-size=1g ..."
"""

from __future__ import annotations

import os
from collections.abc import Callable

SHM_PATH = "/dev/shm"
# NCCL's user guide (Troubleshooting, "Docker") starts containers with --shm-size=1g: the size taken as enough.
NCCL_SHM_BYTES = 1 << 30


def shm_bytes(statvfs: Callable[[str], os.statvfs_result] | None = None, path: str = SHM_PATH) -> int | None:
    """The size of the file system at ``path`` (``/dev/shm``) in bytes; None where it cannot be read (no /dev/shm).

    ``statvfs`` defaults to :func:`os.statvfs`, looked up when called.
    """
    try:
        st = (statvfs or os.statvfs)(path)
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def small_shm_warning(size: int | None, host: str | None = None) -> str | None:
    """One ``hvdkit:`` line when ``size`` bytes of /dev/shm are fewer than NCCL needs, else None (None: unknown)."""
    if size is None or size >= NCCL_SHM_BYTES:
        return None
    where = f" on {host}" if host else ""
    return (f"hvdkit: /dev/shm{where} is {size / (1 << 20):.0f} MiB, less than the {NCCL_SHM_BYTES >> 30} GiB that "
            "NCCL's shared-memory transport and DataLoader workers need on a GPU host: start the container with "
            "--ipc=host or --shm-size=1g (compose: shm_size; Kubernetes: a memory emptyDir at /dev/shm)")
