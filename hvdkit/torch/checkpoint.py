"""Step 6 and resume: rank-0 atomic checkpoints, loaded identically on every rank.

Example::

    hk.save_checkpoint("ckpt.pt", model, optimizer, epoch=epoch)       # rank 0 writes
    extra = hk.load_checkpoint("ckpt.pt", model, optimizer)            # every rank
    start_epoch = extra["epoch"] + 1
"""

from __future__ import annotations

import io
import os

import torch

import hvdkit
from hvdkit.core.checkpoint_files import atomic_write
from hvdkit.torch._horovod import hvd
from hvdkit.torch.context import current
from hvdkit.torch.tensors import to_cpu

FORMAT = "hvdkit.torch/1"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be loaded; raised on every rank with the same message."""


def save_checkpoint(path: str | os.PathLike, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, **extra) -> bool:
    """Write model, optimizer and ``extra`` (epoch, step, ...) to ``path`` on rank 0 only.

    The write is atomic (temporary file + fsync + rename): a crash mid-save
    leaves the previous checkpoint intact. Returns True on the rank that wrote.
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
    atomic_write(path, lambda f: torch.save(state, f))
    return True


def _read(path: str) -> dict:
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist: check the path, or start without --resume")
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

    Returns the ``extra`` dict given to :func:`save_checkpoint`. A missing or
    corrupt file raises :class:`CheckpointError` on every rank (no rank is
    left waiting in a broadcast).
    """
    current()
    payload = None
    if hvd.rank() == root_rank:
        try:
            payload = ("ok", _read(os.fspath(path)))
        except CheckpointError as exc:
            payload = ("error", str(exc))
    status, body = hvd.broadcast_object(payload, root_rank=root_rank, name="hvdkit.checkpoint")
    if status == "error":
        raise CheckpointError(body)
    model.load_state_dict(body["model"])
    if optimizer is not None:
        if body["optimizer"] is None:
            raise CheckpointError(f"checkpoint {os.fspath(path)!r} has no optimizer state: pass optimizer=None to load the model only")
        optimizer.load_state_dict(body["optimizer"])
    return body["extra"]
