"""The small protocol through which the framework-neutral core drives one framework's Horovod binding.

As in Horovod's own elastic core (which takes the framework's collectives
as parameters), everything both adapters do the same way is written once in
the core against this interface: the context and ``init``
(:mod:`hvdkit.runtime.context`), the preemption agreement
(:mod:`hvdkit.runtime.preemption`), metric averaging, checkpoint reads
(:mod:`hvdkit.runtime.checkpoint_files`) and elastic bookkeeping
(:mod:`hvdkit.runtime.elastic`). Each framework implements it once, in
:mod:`hvdkit.backends`: ``torch`` (``horovod.torch``; used by
:mod:`hvdkit.torch` and by Keras 3 on PyTorch) and ``tensorflow``
(``horovod.tensorflow``; Keras 3 on TensorFlow and tf-keras).

Example::

    backend = hvdkit.backends.torch.TorchBackend()
    ctx = hvdkit.runtime.context.init(backend, mode="torch")
    backend.allreduce_floats([loss], "average", name="loss")   # the mean over ranks
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from hvdkit.common.errors import UserError

# The op and compression names hvdkit's API takes, and the attribute of a Horovod framework module each one
# is. The first three reduce gradients (the optimizers' op=, checked by hvdkit.runtime.lr.reduce_options);
# min and max reduce metrics only.
OPS = {"average": "Average", "sum": "Sum", "adasum": "Adasum", "min": "Min", "max": "Max"}
GRADIENT_OPS = ("average", "sum", "adasum")
# bf16: Horovod has no bfloat16 of its own; scripts/patches item 17 adds the type and Compression.bf16.
COMPRESSIONS = {"none": "none", "fp16": "fp16", "bf16": "bf16"}


class Backend(ABC):
    """One framework's Horovod module, seen through what the core needs.

    ``name`` is the framework (``"torch"`` or ``"tensorflow"``), ``framework``
    its name in messages, ``hvd`` the Horovod module (``horovod.torch`` or
    ``horovod.tensorflow``). Topology (``hvd.rank()``...), object broadcast and
    allgather, the op and compression maps and the elastic reset are the same
    for both and written here; tensors, devices and seeds are not.
    """

    name: str
    framework: str
    hvd: Any

    # -- written once for both --------------------------------------------------------
    def reduce_op(self, op: str):
        """Horovod's op object for one of :data:`OPS`' names (e.g. ``"average"`` -> ``hvd.Average``)."""
        return getattr(self.hvd, OPS[op])

    def compression(self, name: str):
        """Horovod's compressor for one of :data:`COMPRESSIONS`' names; bf16 needs the patch's item 17."""
        compressor = getattr(self.hvd.Compression, COMPRESSIONS[name], None)
        if compressor is None:
            raise UserError(f"compression={name!r} needs a Horovod built with hvdkit's patch (bfloat16 is item 17), "
                            f"and this one was built before it: rerun scripts/install.sh (make install), or use "
                            f"compression='fp16'")
        return compressor

    def rank(self) -> int:
        return self.hvd.rank()

    def size(self) -> int:
        return self.hvd.size()

    def topology(self) -> dict[str, int]:
        """rank, size, local and cross ranks and sizes, as Horovod reports them now."""
        h = self.hvd
        return {"rank": h.rank(), "size": h.size(), "local_rank": h.local_rank(), "local_size": h.local_size(),
                "cross_rank": h.cross_rank(), "cross_size": h.cross_size()}

    def broadcast_object(self, obj, root_rank: int, name: str):
        """A picklable object from ``root_rank`` to every rank."""
        return self.hvd.broadcast_object(obj, root_rank=root_rank, name=name)

    def allgather_object(self, obj, name: str) -> list:
        """Every rank's picklable object, in rank order."""
        return self.hvd.allgather_object(obj, name=name)

    def reset(self) -> None:
        """What an elastic reset does to the Horovod runtime: shut down, then join the new world."""
        self.hvd.shutdown()
        self.hvd.init()

    def collective_failure(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a failed Horovod collective that an elastic job survives by a reset.

        Horovod raises ``HorovodInternalError`` itself for the plain ops; a
        backend adds what its framework raises instead (TensorFlow wraps
        the grouped allreduce's failure in its own error type).
        """
        return False

    # -- one per framework --------------------------------------------------------------
    @abstractmethod
    def has_gpu(self) -> bool:
        """Whether the framework can use a GPU on this host."""

    @abstractmethod
    def cuda_build(self) -> str | None:
        """The CUDA version the framework was built for; None for a CPU-only build."""

    @abstractmethod
    def pin(self, rank: int, local_rank: int, local_size: int, use_gpu: bool = True) -> tuple[int | None, Any]:
        """Pin this rank's GPU (via :func:`hvdkit.runtime.topology.pin_gpu`), if the host has one for it.

        Every rank joins the GPU exchange, those on the CPU too. ``use_gpu=False``
        (``HVDKIT_DEVICE=cpu``) keeps the rank on the CPU, its GPUs hidden from
        the framework. Returns the GPU index (None on CPU) and the device in the
        framework's type.
        """

    @abstractmethod
    def set_threads(self, threads: int) -> bool:
        """Set the framework's intra-op thread count; False where it can no longer be set (TensorFlow, once started)."""

    @abstractmethod
    def seed(self, value: int) -> None:
        """Seed the framework's own generators (the core seeds Python's and numpy's)."""

    @abstractmethod
    def allreduce_floats(self, values: Sequence[float], op: str, name: str) -> list[float]:
        """Reduce a short list of Python floats over ranks (float64), e.g. metrics or a flag."""

    @abstractmethod
    def broadcast_tensors(self, named: Sequence[tuple[str, Any]], root_rank: int) -> list:
        """``root_rank``'s value of each named tensor, in order; every rank passes the same names.

        torch tensors are overwritten in place (and returned); TensorFlow's
        are immutable, so the caller assigns the returned values.
        """

    # -- tensors in the framework's own type: the adapters' collectives --------------------
    @abstractmethod
    def allreduce(self, tensor, op: str, name: str | None = None):
        """``tensor`` reduced over ranks with one of :data:`OPS`' names; differentiable where Horovod's is."""

    @abstractmethod
    def grouped_allreduce(self, tensors: Sequence, op: str, compression: str = "none") -> list:
        """Gradients reduced together, which Horovod fuses into few buffers (``op`` one of :data:`GRADIENT_OPS`)."""

    @abstractmethod
    def grouped_allgather(self, tensors: Sequence, name: str) -> list:
        """Each tensor with every rank's rows, in rank order (1-D slices of a whole, for sharded state)."""

    def start_grouped_allgather(self, tensors: Sequence, name: str) -> Callable[[], list]:
        """:meth:`grouped_allgather` started now; the returned function waits for it and returns its result.

        The training thread goes on meanwhile where the framework runs collectives in the background (Horovod's
        torch ops do); this default gathers at once."""
        gathered = self.grouped_allgather(tensors, name)
        return lambda: gathered

    @abstractmethod
    def gather_to(self, root: int, tensors: Sequence, name: str) -> list:
        """Each of ``tensors`` (this rank's 1-D slices) whole on ``root``, in rank order; ``[]`` on the others.

        Horovod has no gather: this is its alltoall, every rank sending its
        slice to ``root`` and nothing to the others, so a rank that does not
        write keeps no copy of the whole (a sharded optimizer's checkpoint).
        """
