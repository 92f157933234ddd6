"""Step 6 and resume: rank-0 atomic checkpoints with checksums, loaded identically on every rank.

Example::

    hk.save_checkpoint("ckpts/", model, optimizer, step=epoch, keep_last=3, epoch=epoch)   # rank 0 writes
    extra = hk.load_checkpoint("ckpts/", model, optimizer)     # newest good one, on every rank
    start_epoch = extra["epoch"] + 1

A single file path works too (``"ckpt.pt"``); a directory adds keep-last-N and
automatic fallback past a damaged newest checkpoint.

The file is a plain ``torch.save`` dict that carries its own SHA-256 over its
content (``"integrity"``), so a copy is verified wherever it goes. For
inference without hvdkit::

    state = torch.load("ckpt.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
"""

from __future__ import annotations

import copy
import io
import logging
import os

import torch

from hvdkit.common.errors import UserError
from hvdkit.runtime import checkpoint, context
from hvdkit.runtime.checkpoint_files import (
    CheckpointError,
    check_on_root,
    unreadable,
    verify_loaded,
)
from hvdkit.runtime.integrity import DIGEST_KEY, content_digest
from hvdkit.torch.context import ADAPTER
from hvdkit.torch.sharded import gathered_state, is_sharded
from hvdkit.torch.tensors import host_copy, plain_module, to_cpu

log = logging.getLogger("hvdkit.torch")

FORMAT = "hvdkit.torch/2"


def tensor_bytes(obj):
    """(dtype and shape, raw bytes) of a dense tensor, for :func:`hvdkit.runtime.integrity.content_digest`."""
    if not isinstance(obj, torch.Tensor):
        return None
    t = obj.detach().cpu()
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.is_quantized:
        t = t.int_repr()
    t = t.resolve_conj().resolve_neg()           # lazy conjugate/negative views have no plain bytes yet
    t = t.contiguous()
    return f"{t.dtype}{tuple(t.shape)}", memoryview(t.reshape(-1).view(torch.uint8).numpy())


def save_checkpoint(path: str | os.PathLike, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, *, step: int | None = None,
                    keep_last: int | None = None, scheduler=None, blocking: bool = True, **extra) -> bool:
    """Write model, optimizer and ``extra`` (epoch, ...) on rank 0 only; returns True on the rank that wrote.

    Call it on every rank, not under ``if ctx.is_main:``: a sharded optimizer's
    state (``shard_optimizer_state=True``) is gathered from all of them first.

    ``path`` is a file, or a directory (ending in '/') holding ``ckpt-<step>.pt``
    files of which the newest ``keep_last`` are kept. Writes are atomic
    (temporary file + fsync + rename) and the file carries a SHA-256 of its
    content: a crash mid-save leaves the previous checkpoint intact, and a
    damaged copy is refused on load. A full or read-only disk raises
    :class:`CheckpointError` naming the fix (run :func:`check_checkpoint_path`
    before training to find out then). ``scheduler`` (a torch LR scheduler)
    is saved beside the optimizer, so :func:`load_checkpoint` can rescale it too.

    ``blocking=False`` returns once the state is copied to host memory (pinned
    on a GPU; not yet run on one); a thread writes it, with the same atomicity, digest and
    ``keep_last``. The next save, the preemption guard's exit, an elastic
    reset and the process's end wait for it; a failure is raised on rank 0 as
    the same :class:`CheckpointError` at the first of those or at the next
    ``optimizer.step()`` (:mod:`hvdkit.runtime.async_save`). Rank 0 holds one
    host copy of the state while it writes.
    """
    _check_scheduler(scheduler, "save_checkpoint")
    sharded = optimizer is not None and is_sharded(optimizer)

    def gather():
        return gathered_state(optimizer, 0, "hk.save_checkpoint") if sharded else None

    def build(header: dict, optimizer_state, snapshot: bool):
        if optimizer is not None and not sharded:
            optimizer_state = optimizer.state_dict()
        copied = host_copy if snapshot else to_cpu      # a background write needs a copy training cannot change
        # The header too: extra= may hold the script's own lists, which it may change while the writer digests.
        state = {**(copy.deepcopy(header) if snapshot else header), "model": copied(plain_module(model).state_dict()),
                 "optimizer": copied(optimizer_state) if optimizer is not None else None}
        if scheduler is not None:
            state["scheduler"] = copied(scheduler.state_dict())

        def write(f):
            state[DIGEST_KEY] = content_digest(state, tensor_bytes)
            torch.save(state, f)

        return write, _tensor_bytes(state)

    return checkpoint.save(path, adapter=ADAPTER, fmt=FORMAT, suffix=".pt", optimizer=optimizer, gather=gather,
                           build=build, verify=_read, step=step, keep_last=keep_last, extra=extra, blocking=blocking)


# Rates a param group holds: the current one, what a scheduler started from (initial_lr), OneCycleLR's bounds.
GROUP_RATES = ("lr", "initial_lr", "max_lr", "min_lr")
# Rates a scheduler holds (CyclicLR's max_lrs); SequentialLR and ChainedScheduler hold schedulers of their own.
SCHEDULER_RATES = ("base_lrs", "_last_lr", "max_lrs")


def _rescale_scheduler(scheduler, factor: float) -> None:
    if factor == 1.0:
        return
    for key in SCHEDULER_RATES:
        if isinstance(scheduler.__dict__.get(key), list):
            setattr(scheduler, key, [lr * factor for lr in getattr(scheduler, key)])
    for inner in scheduler.__dict__.get("_schedulers", []):
        _rescale_scheduler(inner, factor)


def _tensor_bytes(obj) -> int:
    """The bytes of every tensor in a nested state: about a torch.save file's size."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _read(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            state = torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise unreadable(path, exc) from exc
    found = state.get("format") if isinstance(state, dict) else None
    verify_loaded(path, found, FORMAT, state, tensor_bytes)
    return state


def check_checkpoint_path(path: str | os.PathLike, model: torch.nn.Module | None = None,
                          optimizer: torch.optim.Optimizer | None = None, keep_last: int | None = None) -> None:
    """Before training: rank 0 checks a checkpoint can be written at ``path``; every rank raises if not.

    Catches a read-only, unwritable or full checkpoint place at start-up
    instead of after the first epoch. With ``model`` the free space is
    compared with the checkpoint's estimated size: the model's tensors, times 3
    with an ``optimizer`` (room for Adam's two moments), and with ``keep_last``
    (a directory) times the checkpoints the directory will hold.

    Example::

        hk.check_checkpoint_path("ckpts/", model, optimizer)   # CheckpointError on every rank when unusable
    """
    def need() -> int:
        if model is None:
            return 0
        return _tensor_bytes(plain_module(model).state_dict()) * (3 if optimizer is not None else 1)

    check_on_root(path, need, context.backend(ADAPTER), keep_last=keep_last, suffix=".pt")


def _check_scheduler(scheduler, call: str) -> None:
    """``scheduler=`` is the scheduler itself: its state dict alone cannot be rescaled or loaded into."""
    if scheduler is not None and not (hasattr(scheduler, "state_dict") and hasattr(scheduler, "load_state_dict")):
        raise UserError(f"hk.{call}(..., scheduler=) takes the LR scheduler itself, not {type(scheduler).__name__} "
                        "(hvdkit saves its state_dict and rescales its rates on another world size): pass "
                        "scheduler=sched, not sched.state_dict()")


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, root_rank: int = 0, *, scheduler=None,
                    on_resize: str = "rescale", missing_ok: bool = False) -> dict | None:
    """Rank ``root_rank`` reads ``path``; every rank loads the same model/optimizer (and scheduler) state.

    A checkpoint written by a job of another size resumes with the learning
    rates ``scale_lr`` gives for this size, in the optimizer's param groups
    and the scheduler's base rates (:func:`hvdkit.runtime.lr.resume_lr_factor`);
    ``on_resize="error"`` refuses it instead. Continue the data with the
    sampler's ``set_epoch(epoch, start_sample=...)`` from the position saved.
    With a fixed global batch (``DistributedOptimizer(global_batch=loader)``)
    the rate is kept, and the data goes on with ``loader.set_epoch(epoch,
    start_step=...)``, which is checked against the checkpoint's step.
    ``missing_ok=True`` returns None on every rank when there is nothing to
    resume from yet (a requeued job's first run), and loads nothing.

    ``path`` is a file or a checkpoint directory (the newest checkpoint whose
    checksum verifies and which loads; older ones are tried with a warning).
    Returns the ``extra`` dict given to :func:`save_checkpoint`. A missing or
    corrupt checkpoint raises :class:`CheckpointError` on every rank (no rank
    is left waiting in a broadcast).
    """
    _check_scheduler(scheduler, "load_checkpoint")

    def apply(body: dict) -> None:
        try:
            plain_module(model).load_state_dict(body["model"])
        except RuntimeError as exc:         # torch names the missing, unexpected and reshaped keys
            why = " ".join(str(exc).split())
            raise CheckpointError(f"checkpoint {os.fspath(path)!r} does not match this model ({why[:400]}): build "
                                  "the same architecture as the saving script before loading") from exc
        if optimizer is None:
            return
        if body["optimizer"] is None:
            raise CheckpointError(f"checkpoint {os.fspath(path)!r} has no optimizer state: pass optimizer=None "
                                  "to load the model only")
        optimizer.load_state_dict(body["optimizer"])
        if scheduler is not None:
            if "scheduler" not in body:
                raise CheckpointError(f"checkpoint {os.fspath(path)!r} has no scheduler state: save it with "
                                      "save_checkpoint(..., scheduler=scheduler), or load without scheduler=")
            scheduler.load_state_dict(body["scheduler"])

    def set_rates(body: dict, factor: float) -> tuple[float, float] | None:
        for group in optimizer.param_groups:
            for key in GROUP_RATES:
                if key in group:
                    group[key] *= factor
        if scheduler is not None:
            _rescale_scheduler(scheduler, factor)
        if not optimizer.param_groups or "lr" not in optimizer.param_groups[0]:
            return None
        after = float(optimizer.param_groups[0]["lr"])
        return after / factor, after

    return checkpoint.load(path, adapter=ADAPTER, suffix=".pt", read=_read, header_of=lambda body: body,
                           apply=apply, optimizer=optimizer, set_rates=set_rates, root_rank=root_rank,
                           on_resize=on_resize, missing_ok=missing_ok)
