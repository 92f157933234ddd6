"""Step 6 and resume for Keras: rank-0 atomic checkpoints, loaded identically on every rank.

The file is a NumPy ``.npz`` holding the model's variables, the optimizer's
variables and a JSON header, so the same format serves Keras 3 (both
backends) and tf-keras. The header carries a SHA-256 over the whole content,
so a copy of the file is verified wherever it goes. Without hvdkit::

    with np.load("ckpt.npz") as f:
        weights = [f[f"model_{i}"] for i in range(json.loads(bytes(f["header"]))["n_model"])]
    model.set_weights(weights)      # the order of model.weights

Example::

    hk.save_checkpoint("ckpt.npz", model, model.optimizer, epoch=epoch)    # rank 0 writes
    extra = hk.load_checkpoint("ckpt.npz", model, model.optimizer)         # every rank
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

import hvdkit
from hvdkit.core.checkpoint_files import (
    CheckpointError,
    check_on_root,
    read_on_root,
    save_to,
    unreadable,
    verify_loaded,
)
from hvdkit.core.integrity import DIGEST_KEY, content_digest
from hvdkit.keras.collectives import for_mode
from hvdkit.keras.context import current
from hvdkit.keras.optimizer import ensure_built, optimizer_variables

FORMAT = "hvdkit.keras/2"            # /2: the digest inside the file; /1 had a .sha256 beside it
LEGACY_FORMAT = "hvdkit.keras/1"


def _numpy(variable) -> np.ndarray:
    value = variable.numpy() if hasattr(variable, "numpy") else variable.value.detach().cpu().numpy()
    return np.asarray(value)


def save_checkpoint(path: str | os.PathLike, model, optimizer=None, *, step: int | None = None,
                    keep_last: int | None = None, **extra) -> bool:
    """Write model and optimizer variables and ``extra`` on rank 0 only (atomic, self-verifying).

    ``path`` is a file or a directory (ending in '/') of ``ckpt-<step>.npz``
    files, as in :func:`hvdkit.torch.save_checkpoint`.
    """
    ctx = current()
    if not ctx.is_main:
        return False
    ensure_built(model, optimizer)
    model_vars = [_numpy(v) for v in model.variables]
    opt_vars = [_numpy(v) for v in optimizer_variables(optimizer)] if optimizer is not None else []
    if step is not None:
        extra = {"step": step, **extra}
    header = {"format": FORMAT, "hvdkit_version": hvdkit.__version__, "backend": ctx.backend,
              "world_size": ctx.size, "n_model": len(model_vars), "n_optimizer": len(opt_vars), "extra": extra}
    header = json.loads(json.dumps(header))      # hash what a load will see (tuples become lists)
    header[DIGEST_KEY] = content_digest({"header": header, "model": model_vars, "optimizer": opt_vars})
    arrays = {f"model_{i}": a for i, a in enumerate(model_vars)}
    arrays.update({f"optimizer_{i}": a for i, a in enumerate(opt_vars)})
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    save_to(path, lambda f: np.savez(f, **arrays), ".npz", step, keep_last)
    return True


def _read(path: str) -> dict:
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(bytes(data["header"]).decode())
            model_vars = [data[f"model_{i}"] for i in range(header["n_model"])]
            opt_vars = [data[f"optimizer_{i}"] for i in range(header["n_optimizer"])]
    except Exception as exc:
        raise unreadable(path, exc) from exc
    stored = header.pop(DIGEST_KEY, None)        # the digest covers the header without itself
    body = {"header": header, "model": model_vars, "optimizer": opt_vars}
    verify_loaded(path, header.get("format"), (FORMAT, LEGACY_FORMAT), {**body, DIGEST_KEY: stored})
    return body


def check_checkpoint_path(path: str | os.PathLike, model=None, optimizer=None) -> None:
    """Before training: rank 0 checks a checkpoint can be written at ``path``; every rank raises if not.

    As :func:`hvdkit.torch.check_checkpoint_path`; :func:`hvdkit.keras.callbacks`
    runs it for ``preemption_checkpoint`` at the start of ``fit``.
    """
    def need() -> int:
        if model is None or not model.built:
            return 0
        size = sum(math.prod(v.shape) * np.dtype(getattr(v.dtype, "as_numpy_dtype", v.dtype)).itemsize
                   for v in model.variables)      # from the shapes: no copy off the device
        return size * (3 if optimizer is not None else 1)    # room for an Adam-like optimizer's two moments

    coll = for_mode(current().backend)
    check_on_root(path, need, is_root=current().is_main,
                  broadcast=lambda obj: coll.broadcast_object(obj, 0, name="hvdkit.check_checkpoint_path"))


def load_checkpoint(path: str | os.PathLike, model, optimizer=None, root_rank: int = 0) -> dict:
    """Rank ``root_rank`` reads ``path``; every rank assigns the same variables. Returns ``extra``."""
    ctx = current()
    coll = for_mode(ctx.backend)
    body = read_on_root(path, _read, ".npz", is_root=ctx.rank == root_rank,
                        broadcast=lambda obj: coll.broadcast_object(obj, root_rank, name="hvdkit.checkpoint"))
    model_vars = list(model.variables)
    if len(model_vars) != len(body["model"]):
        raise CheckpointError(f"checkpoint {os.fspath(path)!r} has {len(body['model'])} model variables but the "
                              f"model has {len(model_vars)}: build the same architecture before loading")
    for var, value in zip(model_vars, body["model"]):
        var.assign(value)
    if optimizer is not None:
        ensure_built(model, optimizer)
        opt_vars = optimizer_variables(optimizer)
        if len(opt_vars) != len(body["optimizer"]):
            raise CheckpointError(f"checkpoint {os.fspath(path)!r} has {len(body['optimizer'])} optimizer variables, "
                                  f"the optimizer has {len(opt_vars)}: use the same optimizer class and settings")
        for var, value in zip(opt_vars, body["optimizer"]):
            var.assign(value)
    return body["header"]["extra"]
