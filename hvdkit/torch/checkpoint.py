"""Step 6 and resume: rank-0 atomic checkpoints with checksums, loaded identically on every rank.

Example::

    hk.save_checkpoint("ckpts/", model, optimizer, step=epoch, keep_last=3, epoch=epoch)   # rank 0 writes
    extra = hk.load_checkpoint("ckpts/", model, optimizer)     # newest good one, on every rank
    start_epoch = extra["epoch"] + 1

A single file path works too (``"ckpt.pt"``); a directory adds keep-last-N and
automatic fallback past a damaged newest checkpoint.
"""

from __future__ import annotations

import io
import os

import torch

import hvdkit
from hvdkit.core.checkpoint_files import CheckpointError, read_on_root, save_to
from hvdkit.torch._horovod import hvd
from hvdkit.torch.context import current
from hvdkit.torch.tensors import to_cpu

FORMAT = "hvdkit.torch/1"


def save_checkpoint(path: str | os.PathLike, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, *, step: int | None = None,
                    keep_last: int | None = None, **extra) -> bool:
    """Write model, optimizer and ``extra`` (epoch, ...) on rank 0 only; returns True on the rank that wrote.

    ``path`` is a file, or a directory (ending in '/') holding ``ckpt-<step>.pt``
    files of which the newest ``keep_last`` are kept. Writes are atomic
    (temporary file + fsync + rename) with a ``.sha256`` beside each file: a
    crash mid-save leaves the previous checkpoint intact and detectable.
    """
    ctx = current()
    if not ctx.is_main:
        return False
    state = {
        "format": FORMAT,
        "hvdkit_version": hvdkit.__version__,
        "world_size": ctx.size,
        "model": to_cpu(model.state_dict()),
        "optimizer": to_cpu(optimizer.state_dict()) if optimizer is not None else None,
        "extra": extra,
    }
    if step is not None:
        state["extra"] = {"step": step, **extra}
    save_to(path, lambda f: torch.save(state, f), ".pt", step, keep_last)
    return True


def _read(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            state = torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"checkpoint {path!r} is unreadable or corrupt ({type(exc).__name__}): "
                              "restore an older checkpoint or start without --resume") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path!r} is not an hvdkit.torch checkpoint: save it with hvdkit.torch.save_checkpoint")
    return state


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, root_rank: int = 0) -> dict:
    """Rank ``root_rank`` reads ``path``; every rank loads the same model/optimizer state.

    ``path`` is a file or a checkpoint directory (the newest checkpoint whose
    checksum verifies and which loads; older ones are tried with a warning).
    Returns the ``extra`` dict given to :func:`save_checkpoint`. A missing or
    corrupt checkpoint raises :class:`CheckpointError` on every rank (no rank
    is left waiting in a broadcast).
    """
    ctx = current()
    body = read_on_root(path, _read, ".pt", is_root=ctx.rank == root_rank,
                        broadcast=lambda obj: hvd.broadcast_object(obj, root_rank=root_rank, name="hvdkit.checkpoint"))
    model.load_state_dict(body["model"])
    if optimizer is not None:
        if body["optimizer"] is None:
            raise CheckpointError(f"checkpoint {os.fspath(path)!r} has no optimizer state: pass optimizer=None "
                                  "to load the model only")
        optimizer.load_state_dict(body["optimizer"])
    return body["extra"]
