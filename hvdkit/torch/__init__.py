"""hvdkit.torch: Horovod's six steps for PyTorch, done correctly.

    import hvdkit.torch as hk
    ctx = hk.init(seed=42)                                        # 1, 2
    model = Net().to(ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=hk.scale_lr(0.01), momentum=0.9)   # 5
    optimizer = hk.DistributedOptimizer(optimizer, model)         # 3
    hk.broadcast_state(model, optimizer)                          # 4
    ...
    hk.save_checkpoint("ckpt.pt", model, optimizer, epoch=epoch)  # 6 (rank 0 only)

Launch with ``horovodrun -np 2 python train.py``.
The same names as :mod:`hvdkit.keras` where both have the thing; docs/API.md lists both.
"""

from hvdkit.backends.torch import hvd
from hvdkit.common.console import get_logger, progress
from hvdkit.common.errors import UserError
from hvdkit.common.launcher import REQUEUE_EXIT_CODE
from hvdkit.runtime.async_save import wait_for_checkpoint
from hvdkit.runtime.metrics import metric_average
from hvdkit.runtime.nonfinite import NonFiniteGradientError
from hvdkit.runtime.preemption import PreemptionGuard
from hvdkit.runtime.topology import NoGPUError
from hvdkit.torch import elastic
from hvdkit.torch.checkpoint import CheckpointError, check_checkpoint_path, load_checkpoint, save_checkpoint
from hvdkit.torch.context import Context, current, init, seed_everything
from hvdkit.torch.data import ResumableDistributedSampler, ShardSampler, distributed_loader, eval_loader, shard_arrays
from hvdkit.torch.global_batch import GlobalBatchLoader, GlobalStep, global_batch_loader
from hvdkit.torch.metrics import allreduce_sum, evaluate, torchmetrics_sync
from hvdkit.torch.optimizer import DistributedOptimizer, broadcast_state, scale_lr, step, warmup_scheduler
from hvdkit.torch.stragglers import report_stragglers

SyncBatchNorm = hvd.SyncBatchNorm
"""Horovod's ``torch.nn`` BatchNorm with statistics over all ranks (Keras: ``SyncBatchNormalization``)."""

__all__ = [
    "CheckpointError", "Context", "DistributedOptimizer", "GlobalBatchLoader", "GlobalStep", "NoGPUError",
    "NonFiniteGradientError", "PreemptionGuard",
    "REQUEUE_EXIT_CODE",
    "ResumableDistributedSampler", "ShardSampler", "SyncBatchNorm", "UserError",
    "allreduce_sum", "broadcast_state", "check_checkpoint_path", "current", "distributed_loader", "elastic",
    "eval_loader", "evaluate", "global_batch_loader",
    "get_logger", "hvd", "init", "load_checkpoint", "metric_average", "progress", "report_stragglers",
    "save_checkpoint",
    "scale_lr", "seed_everything", "shard_arrays", "step", "torchmetrics_sync", "wait_for_checkpoint",
    "warmup_scheduler",
]


def __dir__():
    return __all__        # the public names only, not the submodules that the imports above loaded
