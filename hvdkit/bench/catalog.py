"""What the benchmarks can run: one table of implementations, and the model names.

Every place that picks an implementation reads this table: the CLI (defaults,
--help and unknown names), the runner (how to launch each, which to skip) and
the workers (what to call). It imports no torch, so the CLI stays fast.

Example::

    impl = implementation("allreduce", "torch")
    impl.controller, impl.framework          # ('gloo', 'torch.distributed')
    [i.name for i in implementations("train")]   # ['hvdkit', 'horovod', 'ddp']
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hvdkit.common.errors import UserError

MODELS = ("mnist", "resnet50")


@dataclass(frozen=True)
class Implementation:
    """One way of doing a benchmark's allreduces: how its processes start, and what its worker calls."""

    name: str
    bench: str                  # the worker that runs it: "allreduce" or "train"
    framework: str              # what the worker calls: "hvdkit", "horovod", "torch.distributed", "mpi4py" or "ps"
    description: str
    # horovodrun's controller: "auto" is whatever `hvdkit launch` would pick
    # (hvdkit.ops.launch.choose_controller); None: started by torchrun.
    controller: str | None = "auto"
    average: bool = True        # mpi4py: scale the sum by 1/size after the allreduce
    reference: bool = False     # the allreduce table gives hvdkit's bandwidth as a share of this one's
    default: bool = True        # run when --impls is not given
    compression: str = "none"   # hvdkit's DistributedOptimizer(compression=...): the gradients' wire type

    @property
    def torchrun(self) -> bool:
        """Started by ``torchrun --standalone``, so on this host only."""
        return self.controller is None


CATALOG = (
    Implementation("hvdkit", "allreduce", "hvdkit",
                   "hvdkit.torch.init(), then DistributedOptimizer's in-place allreduce_async_ per gradient, "
                   "launched as hvdkit launch would"),
    Implementation("horovod-mpi", "allreduce", "horovod",
                   "the same call after a plain hvd.init(), under horovodrun --mpi with Horovod's defaults",
                   controller="mpi"),
    Implementation("horovod-gloo", "allreduce", "horovod", "the same under horovodrun --gloo", controller="gloo"),
    Implementation("torch", "allreduce", "torch.distributed",
                   "torch.distributed.all_reduce (Gloo on CPU, NCCL on GPU), rendezvous at MASTER_ADDR:MASTER_PORT",
                   controller="gloo"),
    Implementation("mpi4py", "allreduce", "mpi4py", "MPI.COMM_WORLD.Allreduce in place: raw MPI's sum",
                   controller="mpi", average=False, reference=True),
    Implementation("mpi4py-avg", "allreduce", "mpi4py",
                   "the same sum, then one in-place scale by 1/size: the least any averaging allreduce does",
                   controller="mpi", reference=True),
    Implementation("ps", "allreduce", "ps",
                   "a parameter server: the first process (put it on a host of its own) receives every worker's "
                   "tensors over torch.distributed (Gloo) point-to-point, averages them and sends them back; "
                   "-np counts it; not run unless named", controller="gloo", default=False),
    Implementation("hvdkit", "train", "hvdkit",
                   "the hvdkit.torch recipe: init, distributed_loader, DistributedOptimizer, broadcast_state"),
    Implementation("hvdkit-fp16", "train", "hvdkit",
                   "the hvdkit recipe with compression='fp16': gradients sent as float16; not run unless named",
                   default=False, compression="fp16"),
    Implementation("hvdkit-bf16", "train", "hvdkit",
                   "the hvdkit recipe with compression='bf16': gradients sent as bfloat16 (patch item 17); "
                   "not run unless named", default=False, compression="bf16"),
    Implementation("horovod", "train", "horovod",
                   "the same model by hand, as Horovod's pytorch_mnist example (hvd calls, DistributedSampler)"),
    Implementation("ddp", "train", "torch.distributed",
                   "DistributedDataParallel under torchrun (Gloo on CPU, NCCL on GPU); this host only",
                   controller=None),
    Implementation("ps", "train", "ps",
                   "each step's gradients, flattened, averaged by a parameter server (the first process, on a host "
                   "of its own) over torch.distributed (Gloo) point-to-point; -np counts it; not run unless named",
                   controller="gloo", default=False),
)


def implementations(bench: str, names: Iterable[str] | None = None) -> tuple[Implementation, ...]:
    """``bench``'s implementations called ``names`` (the default ones when None), in the order given."""
    table = {i.name: i for i in CATALOG if i.bench == bench}
    if names is None:
        return tuple(i for i in table.values() if i.default)
    for name in names:
        if name not in table:
            raise UserError(f"unknown implementation {name!r} for bench {bench}: use some of {', '.join(table)}")
    return tuple(table[name] for name in names)


def every_implementation(bench: str) -> tuple[Implementation, ...]:
    """All of ``bench``'s implementations, those run only when named too (for --help and the workers)."""
    return tuple(i for i in CATALOG if i.bench == bench)


def implementation(bench: str, name: str) -> Implementation:
    """``bench``'s implementation called ``name``."""
    return implementations(bench, [name])[0]


def check_models(names: Iterable[str]) -> None:
    for name in names:
        if name not in MODELS:
            raise UserError(f"model {name!r} is unknown: use {' or '.join(MODELS)}")
