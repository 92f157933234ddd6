"""Step 6 and resume, once for both adapters: the header, the order of a save, the rates on a resume.

A save gathers first (a sharded optimizer's slices, from every rank), then
rank 0 alone builds the header and writes; a load reads on the root, hands
every rank the same body, applies it, then rescales the learning rates for
this world size. The adapters supply only what differs: how to collect the
state, write and read their file format, apply a body, and set the rates.

Example (what ``hvdkit.torch.save_checkpoint`` does)::

    save(path, adapter=ADAPTER, fmt="hvdkit.torch/2", suffix=".pt", optimizer=optimizer,
         gather=lambda: gathered_state(optimizer, 0, "hk.save_checkpoint") if sharded else None,
         build=lambda header, gathered, snapshot: (write_file, size_in_bytes), verify=read_file,
         step=step, keep_last=keep_last, extra={"epoch": 3})
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, BinaryIO

import hvdkit
from hvdkit.runtime import async_save, context
from hvdkit.runtime.checkpoint_files import CheckpointError, read_on_root, save_to
from hvdkit.runtime.lr import (
    check_on_resize,
    job_lr_scale,
    resume_lr_factor,
    resumed_global_batch_line,
    resumed_rate_line,
)
from hvdkit.runtime.optimizer_record import attach, global_batch_of, op_of, record_of

log = logging.getLogger("hvdkit.checkpoint")

Build = Callable[[dict, Any, bool], tuple[Callable[[BinaryIO], None], int]]


def header(fmt: str, ctx, optimizer, extra: dict, step: int | None) -> dict:
    """What every checkpoint records beside the tensors: format, version, world size, ``extra``, the rate's scale.

    ``lr_scale`` is stored only when the script asked for a scaled rate
    (``hk.scale_lr``): a resume on another size then rescales by the ratio.
    ``warmup_target`` is the rate ``hk.callbacks()``'s warmup ramps to, when one runs.
    """
    head = {"format": fmt, "hvdkit_version": hvdkit.__version__, "world_size": ctx.size,
            "extra": {"step": step, **extra} if step is not None else extra}
    if optimizer is not None and context.scales_lr():
        head["lr_scale"] = job_lr_scale(ctx, op_of(optimizer))
    record = None if optimizer is None else record_of(optimizer)
    if record is not None and record.warmup_target is not None:
        head["warmup_target"] = float(record.warmup_target)
    if record is not None and record.global_batch is not None:
        head["global_batch"] = record.global_batch.state_dict()     # the plan and the place in it
    return head


def save(path: str | os.PathLike, *, adapter: str, fmt: str, suffix: str, optimizer, gather: Callable[[], Any],
         build: Build, verify: Callable[[str], Any], step: int | None, keep_last: int | None,
         extra: dict, blocking: bool = True) -> bool:
    """Every rank calls it; rank 0 writes and returns True.

    ``gather()`` runs on every rank first (collective where the state is
    sharded); ``build(header, gathered, snapshot)`` runs on rank 0 and returns
    the writer and the file's estimated size; with ``snapshot`` it first copies
    the state to host memory, so that training may change it while the writer
    runs. ``verify(path)`` reads an older checkpoint back for keep-last-N.
    ``blocking=False`` writes in a background thread (:mod:`hvdkit.runtime.async_save`);
    a save in flight is waited for first, and its failure raised here once this save is written (blocking) or
    started, so that a failed periodic save does not also cost the preemption's.
    """
    ctx = context.current(adapter)
    try:
        async_save.wait_for_checkpoint()
        earlier = None
    except CheckpointError as exc:      # raised once this save is written: a preemption's save still happens
        earlier = exc
    gathered = gather()
    if not ctx.is_main:
        return False
    write, need_bytes = build(header(fmt, ctx, optimizer, extra, step), gathered, not blocking)
    if blocking:
        save_to(path, write, suffix, step, keep_last, verify=verify, need_bytes=need_bytes)
    else:
        async_save.start(lambda: save_to(path, write, suffix, step, keep_last, verify=verify, need_bytes=need_bytes),
                         os.fspath(path))
    if earlier is not None:
        raise earlier
    return True


def load(path: str | os.PathLike, *, adapter: str, suffix: str, read: Callable[[str], Any],
         header_of: Callable[[Any], dict], apply: Callable[[Any], None], optimizer,
         set_rates: Callable[[Any, float], tuple[float, float] | None], root_rank: int, on_resize: str,
         missing_ok: bool) -> dict | None:
    """Every rank calls it and gets the checkpoint's ``extra`` (None: nothing to resume from, ``missing_ok``).

    ``apply(body)`` loads the model and optimizer state; ``set_rates(body,
    factor)`` multiplies the optimizer's rates by ``factor`` (this world size's
    scale over the saving one's) and returns (before, after) of the first rate
    for the line rank 0 prints, or None when it changed nothing.
    """
    check_on_resize(on_resize)
    async_save.wait_for_checkpoint()        # a save in flight: read what it writes, and prune nothing mid-read
    body = read_on_root(path, read, suffix, context.backend(adapter), root_rank, missing_ok=missing_ok)
    if body is None:
        return None
    head = header_of(body)
    apply(body)
    if optimizer is not None:
        ctx = context.current(adapter)
        op = op_of(optimizer)
        scaled = head.get("lr_scale") if context.scales_lr() else None    # a fixed-rate script keeps its rate
        factor = resume_lr_factor(scaled, head.get("world_size"), job_lr_scale(ctx, op), ctx.size, op=op,
                                  on_resize=on_resize, path=f"checkpoint {os.fspath(path)!r}")
        changed = set_rates(body, factor)
        if factor != 1.0 and changed is not None and ctx.is_main:
            log.warning(resumed_rate_line(head.get("world_size"), ctx.size, *changed))
        loader = global_batch_of(optimizer)
        if loader is not None:
            loader.resumed(head.get("global_batch"))
        plan = None if loader is None else loader.plan
        saved = head.get("global_batch")
        if loader is not None and ctx.is_main and (head.get("world_size") != ctx.size or saved is None
                                                   or (saved["global_batch"], saved["micro_batch"])
                                                   != (plan.global_batch, plan.micro_batch)):
            log.warning(resumed_global_batch_line(head.get("world_size"), ctx.size, head.get("global_batch"),
                                                  loader.plan))
        if head.get("warmup_target") is not None:     # saved mid-warmup: the rate it ramps to, for this size
            attach(optimizer, warmup_target=head["warmup_target"] * factor)
    return head["extra"]
