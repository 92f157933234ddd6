"""Where a process sits in a Horovod job, and which GPU it takes, independent of the framework.

Each adapter's ``init()`` returns a subclass that adds its device in the
framework's own type (``torch.device``, or a TensorFlow device string).

Example::

    ctx = hvdkit.torch.init()
    ctx.print(f"{ctx.size} processes on {ctx.cross_size} hosts")     # on rank 0 only
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hvdkit.common.errors import UserError


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

    def print(self, *args, **kwargs) -> None:
        """``print`` on rank 0 only, flushed (as Accelerate's and Fabric's ``print``): one line a job, not a rank.

        Example::

            ctx.print(f"epoch {epoch}: loss {loss:.4f}")
        """
        if self.rank == 0:
            kwargs.setdefault("flush", True)       # under a launcher stdout is a pipe: lines would wait in a buffer
            print(*args, **kwargs)


def cpu_threads_per_rank(local_size: int) -> int | None:
    """Intra-op threads per process so a host's ranks share its cores instead of oversubscribing.

    None when the user set OMP_NUM_THREADS (their choice wins).
    """
    if "OMP_NUM_THREADS" in os.environ:
        return None
    return share_of_cores(local_size)


def share_of_cores(local_size: int) -> int:
    """This host's cores divided among its ``local_size`` processes (at least 1).

    Not the process's CPU affinity: under Slurm's binding that is already the
    rank's own share, and dividing it again would starve each rank.
    """
    return max(1, (os.cpu_count() or 1) // max(local_size, 1))


def loader_workers(local_size: int, on_gpu: bool) -> int:
    """Data-loading worker processes per rank when the user names none: 0 on the CPU, up to 4 on a GPU.

    On a GPU the step is short and the input must be ready when it starts: with
    no workers, a ResNet-50 step at 224 px (batch 16, 17.3 ms on an H100) waited
    9.2% of it for collation and the host copy (make test-gpu, docs/GPU.md).
    Workers prepare the next batches, and pinned memory, while the GPU computes.
    On the CPU workers would take cores from the step's own threads. Each rank
    keeps one core of its share for itself.
    """
    if not on_gpu:
        return 0
    return max(0, min(4, share_of_cores(local_size) - 1))


class NoGPUError(UserError):
    """This rank has no GPU of its own: more ranks than GPUs, ranks sharing one, or GPUs that CUDA cannot use."""


# horovodrun sets it to "1" in every worker of an elastic job (horovod/runner/gloo_run.py).
ELASTIC = "HOROVOD_ELASTIC"


def is_elastic(environ=os.environ) -> bool:
    """This process is a worker of an elastic job (horovodrun sets HOROVOD_ELASTIC=1)."""
    return environ.get(ELASTIC) == "1"


def hides_all_gpus(cuda_visible_devices: str | None) -> bool:
    """True when CUDA_VISIBLE_DEVICES shows no GPU (empty, ``-1``): CUDA stops at the first entry that is not
    an index or a ``GPU-``/``MIG-`` UUID, so the user (or the launcher) chose the CPU."""
    return cuda_visible_devices is not None and not re.match(r"\s*(\d|GPU-|MIG-)", cuda_visible_devices)


@dataclass(frozen=True)
class GPUView:
    """What one rank sees before it pins a GPU; the ranks exchange these to agree on a GPU each.

    ``uuids`` are the visible GPUs' UUIDs in the framework's order (index i is
    ``cuda:i`` or TensorFlow's ``GPU:i``), None for a GPU the framework cannot name.

    Example::

        GPUView(rank=1, host="node1", local_rank=1, local_size=2, uuids=("GPU-5a1f...",),
                cuda_visible_devices="0").choice      # 0: Slurm gave this rank its own GPU
    """

    rank: int
    host: str
    local_rank: int
    local_size: int
    uuids: tuple[str | None, ...]
    cuda_visible_devices: str | None = None

    @classmethod
    def here(cls, rank: int, local_rank: int, local_size: int, uuids, use_gpu: bool = True) -> GPUView:
        """This process's view; ``uuids`` may be the framework's UUID objects (their ``str()``) or None.

        ``use_gpu=False`` (``HVDKIT_DEVICE=cpu``): no GPU, hidden by choice (as
        ``CUDA_VISIBLE_DEVICES=-1``), so the ranks do not take it for a lost GPU.
        """
        import socket

        if not use_gpu:
            return cls(rank, socket.gethostname(), local_rank, local_size, (), "-1")
        return cls(rank, socket.gethostname(), local_rank, local_size,
                   tuple(None if u is None else str(u) for u in uuids), os.environ.get("CUDA_VISIBLE_DEVICES"))

    @property
    def gpus(self) -> tuple[str, ...]:
        """Each visible GPU's identity: its UUID as nvidia-smi prints it, else its CUDA_VISIBLE_DEVICES entry.

        The fallback (only where the framework gives no UUID) tells GPUs apart
        unless the launcher renumbers each rank's own GPU to 0, as Slurm's cgroups
        (ConstrainDevices) do: those ranks look alike and get the slots error.
        """
        entries = self.cuda_visible_devices.split(",") if self.cuda_visible_devices else []
        return tuple(_uuid_name(u) if u else f"CUDA_VISIBLE_DEVICES entry {entries[i] if i < len(entries) else i}"
                     for i, u in enumerate(self.uuids))

    @property
    def choice(self) -> int:
        """The visible GPU this rank takes: its local rank when it sees a GPU per local rank (the launcher showed it
        the whole host), else the first (the launcher gave it its own GPU: Slurm, a pod, a per-rank export)."""
        return self.local_rank if len(self.uuids) >= self.local_size else 0


def _describe(view: GPUView) -> str:
    cvd = "unset" if view.cuda_visible_devices is None else view.cuda_visible_devices
    return (f"rank {view.rank} (local rank {view.local_rank}) takes GPU {view.choice} of the {len(view.uuids)} "
            f"it sees with CUDA_VISIBLE_DEVICES={cvd}")


def _uuid_name(uuid: str) -> str:
    # torch prints a UUID without nvidia-smi's "GPU-" prefix, the CUDA driver library's has it (runtime.cuda_driver).
    uuid = uuid.strip()
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def check_gpu_choice(views: Sequence[GPUView], rank: int) -> int | None:
    """``rank``'s GPU index once its host's ranks are known to each take a GPU of their own; NoGPUError if not.

    ``views`` come from every rank of the job (one allgather, CPU ranks
    included). Each rank takes :attr:`GPUView.choice`, so a host that shows
    every rank all its GPUs pins GPU N on local rank N, and a launcher that
    gives each rank its own GPU(s) (Slurm, a pod, a per-rank
    CUDA_VISIBLE_DEVICES) has each pin its first. Then:

    - some ranks see GPUs and others see none without having hidden them
      (CUDA_VISIBLE_DEVICES empty or -1): every rank gets the mixed-job
      error, which names the hosts without a GPU (a host whose ranks were
      started outside the launcher's GPU binding, or whose driver is gone);
    - a rank that sees no GPU gets None (the CPU);
    - among the ranks of ``rank``'s host that see a GPU: when every rank sees
      the same GPUs and there are fewer than ranks, the ranks left over get
      the slots error (the others carry on; the job stops); else two ranks
      whose choices are one physical GPU (compared by UUID, see
      :attr:`GPUView.gpus`) each get the sharing error.

    Example::

        a, b = "GPU-aaaaaaaa-...", "GPU-bbbbbbbb-..."
        views = [GPUView(0, "n1", 0, 2, (a,), "0"), GPUView(1, "n1", 1, 2, (b,), "0")]   # Slurm cgroups
        check_gpu_choice(views, 1)       # 0: its own GPU b
    """
    blind = [v for v in views if not v.uuids and not hides_all_gpus(v.cuda_visible_devices)]
    if blind and any(v.uuids for v in views):
        raise NoGPUError(_mixed_message(blind, [v for v in views if v.uuids]))
    me = next(v for v in views if v.rank == rank)
    if not me.uuids:
        return None
    host = [v for v in views if v.host == me.host and v.uuids]
    if len({v.gpus for v in host}) == 1 and any(v.local_rank >= len(v.gpus) for v in host):
        if me.local_rank >= len(me.gpus):
            raise NoGPUError(_slots_message(me.local_rank, me.local_size, len(me.gpus), me.cuda_visible_devices))
        return me.choice          # the ranks past the host's GPUs stop the job with the slots error
    taken = me.gpus[me.choice]
    sharing = sorted((v for v in host if v.gpus[v.choice] == taken), key=lambda v: v.rank)
    if len(sharing) > 1:
        raise NoGPUError(
            f"{_ranks_text([v.rank for v in sharing])} on {me.host} would share GPU {taken} "
            f"({'; '.join(_describe(v) for v in sharing)}): "
            f"give each rank its own GPU (srun --gpus-per-task=1, or a different CUDA_VISIBLE_DEVICES per rank) "
            f"or show every rank all of the host's GPUs, and hvdkit pins one per local rank"
        )
    return me.choice


def pin_gpu(view: GPUView, allgather: Callable[[GPUView], list], pin: Callable[[int], None], *,
            pin_first: bool = False, environ: Mapping[str, str] | None = None) -> int | None:
    """Pin this rank's GPU (:attr:`GPUView.choice`) after :func:`check_gpu_choice` compared it with the job's.

    ``allgather`` is the framework's object allgather, called once on every
    rank, those without a GPU (``view.uuids`` empty) too: a job where some
    hosts show no GPU must stop with one error, not leave the GPU ranks
    waiting in an exchange the others never join. ``pin(index)`` is the
    framework's set-device. With ``pin_first`` the check follows the pin
    (TensorFlow: its collectives start its runtime, after which its visible
    GPUs are fixed). In an elastic job there is no check: a worker that joins
    later runs ``init()`` while the others train, so an allgather there would
    pair with nothing. Returns the GPU index, None on the CPU.

    Example::

        gpu = pin_gpu(view, lambda v: hvd.allgather_object(v, name="hvdkit.gpus"), torch.cuda.set_device)
    """
    environ = os.environ if environ is None else environ
    if pin_first and view.uuids:
        pin(view.choice)
    if environ.get(ELASTIC) != "1":
        check_gpu_choice(allgather(view), view.rank)
    if not view.uuids:
        return None
    if not pin_first:
        pin(view.choice)
    return view.choice


def _mixed_message(blind: Sequence[GPUView], seeing: Sequence[GPUView]) -> str:
    blind_hosts = ", ".join(sorted({v.host for v in blind}))
    return (f"{_ranks_text([v.rank for v in blind])} on {blind_hosts} {'sees' if len(blind) == 1 else 'see'} no GPU "
            f"while {_ranks_text([v.rank for v in seeing])} on {', '.join(sorted({v.host for v in seeing}))} "
            f"{'does' if len(seeing) == 1 else 'do'}: a job runs on GPUs on every host or on none; check the GPUs "
            f"and driver on {blind_hosts} (nvidia-smi there) and that the launcher did not hide them, or set "
            f"HVDKIT_DEVICE=cpu to train on the CPU")


def _ranks_text(ranks: Sequence[int]) -> str:
    names = [str(r) for r in sorted(ranks)]
    if len(names) == 1:
        return f"rank {names[0]}"
    if len(names) > 6:
        return f"{len(names)} ranks ({', '.join(names[:3])}, ...)"
    return "ranks " + ", ".join(names[:-1]) + f" and {names[-1]}"


def _slots_message(local_rank: int, local_size: int, visible: int, cuda_visible_devices: str | None) -> str:
    return (f"local rank {local_rank} has no GPU: this host runs {local_size} processes but {visible} GPU(s) are "
            f"visible (CUDA_VISIBLE_DEVICES={cuda_visible_devices if cuda_visible_devices is not None else 'unset'}); "
            f"lower the host's slots to {visible} in -H/--hostfile or expose more GPUs")
