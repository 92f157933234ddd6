"""Learning-rate rules for data-parallel training (Horovod step 5).

The linear scaling rule: with N workers each taking batch B, the effective batch
is N*B, so the learning rate is scaled by N (Goyal et al., "Accurate, Large
Minibatch SGD", 2017). A large scaled rate diverges early in training, so it is
reached by a gradual warmup from the single-worker rate over the first steps.

Example::

    lr = scale_lr(0.01, size=8)                     # 0.08
    warmup_lr(step=0, warmup_steps=100, base_lr=0.01, target_lr=lr)   # 0.01
"""

from __future__ import annotations

from hvdkit.common.errors import UserError
from hvdkit.runtime import context
from hvdkit.runtime.backend import COMPRESSIONS, GRADIENT_OPS
from hvdkit.runtime.checkpoint_files import CheckpointError
from hvdkit.runtime.topology import Topology


def reduce_options(op: str, compression: str = "none", *, on_mpi: bool = True) -> tuple[str, str]:
    """``op`` and ``compression`` as both adapters take them (any case), lower-cased; a UserError naming the choices.
    ``on_mpi``: the job's controller is MPI (or it has one rank), which Horovod's Adasum needs."""
    op_l, compression_l = str(op).lower(), str(compression).lower()
    if op_l not in GRADIENT_OPS or compression_l not in COMPRESSIONS:
        what = f"unknown op {op!r}" if op_l not in GRADIENT_OPS else f"unknown compression {compression!r}"
        raise UserError(f"{what}: op is one of {', '.join(GRADIENT_OPS)}, compression one of "
                        f"{', '.join(COMPRESSIONS)}")
    if op_l == "adasum" and compression_l == "bf16":
        # Horovod's Adasum kernels (adasum.h) have no bfloat16 case: every step would fail.
        raise UserError("op='adasum' cannot take compression='bf16' (Horovod's Adasum has no bfloat16): "
                        "use compression='fp16' or 'none' with Adasum, or op='average' with bf16")
    if op_l == "adasum" and not on_mpi:
        # Horovod implements Adasum over MPI only (its GPU path too): on Gloo every step raised
        # "HorovodInternalError: No Adasum operation enabled" from inside the first backward pass.
        raise UserError("op='adasum' needs the MPI controller and this job runs on Gloo (Horovod has no Adasum on "
                        "Gloo): launch with hvdkit launch's default or horovodrun --mpi, or use op='average'")
    return op_l, compression_l


def job_reduce_options(backend, size: int, op: str, compression: str = "none") -> tuple[str, str]:
    """:func:`reduce_options` for this job, as both adapters' DistributedOptimizer checks them: Adasum needs MPI.
    An elastic job runs on Gloo whatever its size (one that starts on one worker fails once others join)."""
    from hvdkit.runtime import topology

    on_mpi = bool(backend.hvd.mpi_enabled()) or (size == 1 and not topology.is_elastic())
    return reduce_options(op, compression, on_mpi=on_mpi)


def scale_lr(base_lr: float, size: int, *, op: str = "average", local_size: int | None = None,
             on_gpu: bool = False) -> float:
    """The learning rate for ``size`` workers under the linear scaling rule.

    With ``op="adasum"`` Horovod's guidance differs: Adasum adapts to the
    gradients, so the rate is scaled by the GPUs of one host (``local_size``,
    which share a node-local NCCL reduction) on GPU, and not at all on CPU.
    """
    if base_lr <= 0:
        raise UserError(f"base_lr must be positive, got {base_lr}: pass the single-worker learning rate")
    if size < 1:
        raise UserError(f"size must be >= 1, got {size}: call init() before scale_lr()")
    op, _ = reduce_options(op)
    if op == "average":
        return base_lr * size
    if op == "sum":
        # Summed gradients already grow with size; scaling the rate too would square it.
        return base_lr
    if op == "adasum":
        if not on_gpu:
            return base_lr
        if local_size is None:
            raise UserError("op='adasum' on GPU needs local_size: pass hvd.local_size()")
        return base_lr * local_size
    raise AssertionError(op)   # reduce_options admits only the three


def scale_lr_for(base_lr: float, ctx: Topology, op: str = "average") -> float:
    """:func:`scale_lr` for the job ``ctx`` describes (its size, local size, and whether it pinned a GPU).

    It notes on the process context that the script scales its rate: only then do its checkpoints record
    (and a resume undo) the scale.
    """
    context.note_scaled_lr()
    return scale_lr(base_lr, ctx.size, op=op, local_size=ctx.local_size, on_gpu=ctx.gpu is not None)


def job_lr_scale(ctx: Topology, op: str = "average") -> float:
    """``scale_lr(1.0)`` for this job, without counting as the script asking for a scaled rate."""
    return scale_lr(1.0, ctx.size, op=op, local_size=ctx.local_size, on_gpu=ctx.gpu is not None)


def warmup_steps(warmup_steps: int | None = None, warmup_epochs: float | None = None,
                 steps_per_epoch: int | None = None) -> int:
    """Warmup length in optimizer steps, given in steps or in epochs (then ``steps_per_epoch`` is needed)."""
    if warmup_steps is not None and warmup_epochs is not None:
        raise UserError("give warmup_steps or warmup_epochs, not both")
    if warmup_epochs is not None:
        if warmup_epochs < 0:
            raise UserError(f"warmup_epochs must be >= 0, got {warmup_epochs}")
        if not steps_per_epoch or steps_per_epoch < 1:
            raise UserError("warmup_epochs needs steps_per_epoch (e.g. len(train_loader)) to count steps")
        return int(warmup_epochs * steps_per_epoch)
    if warmup_steps is None:
        return 0
    if warmup_steps < 0:
        raise UserError(f"warmup_steps must be >= 0, got {warmup_steps}")
    return int(warmup_steps)


def warmup_lr(step: int, warmup_steps: int, base_lr: float, target_lr: float) -> float:
    """Linear warmup from ``base_lr`` at step 0 to ``target_lr`` at ``warmup_steps``, then flat.

    Steps are batches, so the rate rises smoothly within an epoch rather than
    jumping at epoch boundaries (Goyal et al. ramp per iteration).
    """
    if warmup_steps < 0:
        raise UserError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if warmup_steps == 0 or step >= warmup_steps:
        return target_lr
    return base_lr + (target_lr - base_lr) * step / warmup_steps


RESIZE_CHOICES = ("rescale", "error")


def check_on_resize(on_resize: str) -> None:
    """``load_checkpoint``'s ``on_resize``, checked before anything is read (also without an optimizer)."""
    if on_resize not in RESIZE_CHOICES:
        raise UserError(f"on_resize={on_resize!r}: give one of {', '.join(RESIZE_CHOICES)}")


def resume_lr_factor(saved_scale: float | None, saved_size: int | None, now_scale: float, size: int, *,
                     op: str = "average", on_resize: str = "rescale", path: str = "checkpoint") -> float:
    """What to multiply a checkpoint's learning rates by when a job resumes on ``size`` ranks.

    A checkpoint holds the rates its optimizer had, scaled for the job that
    wrote it (:func:`scale_lr`). Resumed on another number of ranks, the
    gradients are averaged over that many, so the rate must be what
    ``scale_lr`` gives for the new size: 2 to 3 ranks at ``average`` is x1.5
    (a 0.02 rate becomes 0.03). ``saved_scale`` is ``scale_lr(1.0)`` when the
    checkpoint was written by a script that used ``scale_lr``; None (a script
    with a fixed rate, or a file from before hvdkit stored it) leaves the
    rates as they are. ``on_resize="error"`` refuses another size instead.
    """
    check_on_resize(on_resize)
    if on_resize == "error" and saved_size is not None and saved_size != size:
        raise CheckpointError(f"{path} was written by a job of {saved_size} ranks and this one has {size}: run on "
                              f"{saved_size} ranks, or load with on_resize='rescale' to continue with the learning "
                              f"rate scaled for {size} and the data from where it stopped")
    if saved_scale is None or saved_scale == now_scale:
        return 1.0
    return now_scale / saved_scale


def resumed_rate_line(saved_size: int | None, size: int, before: float, after: float) -> str:
    """The one line a resume on another world size prints (rank 0): the checkpoint's rate and this job's.

    Not an ``hvdkit:`` line: those are warnings, and a correct script prints none (test_examples_quiet.py).
    """
    return (f"hvdkit resume: a checkpoint of {saved_size} ranks on {size}: learning rate {before:g} -> {after:g}, "
            "as scale_lr gives for this size (load_checkpoint(..., on_resize='error') refuses another size)")


def resumed_global_batch_line(saved_size: int | None, size: int, saved: dict | None, plan) -> str:
    """The resume line of a fixed global batch (rank 0): the rate is kept, since the batch it was set for is.

    ``saved`` is the checkpoint's ``{"global_batch", "micro_batch"}`` (None: written in the per-rank mode),
    ``plan`` this job's :class:`hvdkit.runtime.global_batch.GlobalBatch`.
    """
    now = plan.describe(size)
    if saved is None:
        return (f"hvdkit resume: a checkpoint of {saved_size} ranks, written with a per-rank batch, on {size} with a "
                f"{now}: learning rate kept as the checkpoint has it")
    if (saved["global_batch"], saved["micro_batch"]) != (plan.global_batch, plan.micro_batch):
        return (f"hvdkit resume: a checkpoint of {saved_size} ranks with global batch {saved['global_batch']} "
                f"(micro-batch {saved['micro_batch']}) on {size} with a {now}: learning rate kept, and the steps "
                "differ from the run that wrote it")
    return (f"hvdkit resume: a checkpoint of {saved_size} ranks on {size}: the {now}, the same steps, so the "
            "learning rate is kept")
