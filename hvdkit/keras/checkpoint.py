"""Step 6 and resume for Keras: rank-0 atomic checkpoints, loaded identically on every rank.

The file is a NumPy ``.npz`` holding the model's variables, the optimizer's
variables and a JSON header with their names, so the same format serves
Keras 3 (both backends) and tf-keras. Loading matches variables by name (as
torch's ``load_state_dict`` does), and says which names are missing or have
another shape. The header carries a SHA-256 over the whole content, so a copy
of the file is verified wherever it goes. Without hvdkit::

    with np.load("ckpt.npz") as f:
        weights = [f[f"model_{i}"] for i in range(json.loads(bytes(f["header"]))["n_model"])]
    model.set_weights(weights)      # the order of model.weights (names: header["model_names"])

Example::

    hk.save_checkpoint("ckpt.npz", model, model.optimizer, epoch=epoch)    # rank 0 writes
    extra = hk.load_checkpoint("ckpt.npz", model, model.optimizer)         # every rank
"""

from __future__ import annotations

import json
import logging
import math
import os

import numpy as np

from hvdkit.keras.collectives import variable_numpy
from hvdkit.keras.context import ADAPTER, backend, current
from hvdkit.keras.optimizer import get_learning_rate, named_variables, saves_learning_rate, set_learning_rate
from hvdkit.keras.sharded import check_same_loads, gather_whole, sharded_part
from hvdkit.runtime import checkpoint
from hvdkit.runtime.checkpoint_files import (
    CheckpointError,
    check_on_root,
    unreadable,
    verify_loaded,
)
from hvdkit.runtime.integrity import DIGEST_KEY, content_digest

log = logging.getLogger("hvdkit.keras")

FORMAT = "hvdkit.keras/3"


def save_checkpoint(path: str | os.PathLike, model, optimizer=None, *, step: int | None = None,
                    keep_last: int | None = None, blocking: bool = True, **extra) -> bool:
    """Write model and optimizer variables and ``extra`` on rank 0 (atomic, self-verifying); call it on every rank.

    ``path`` is a file or a directory (ending in '/') of ``ckpt-<step>.npz``
    files, as in :func:`hvdkit.torch.save_checkpoint`. The other ranks return
    False at once, except with a sharded optimizer, whose slots they send to
    rank 0 first (a collective: under ``if ctx.is_main:`` rank 0 would wait).
    ``blocking=False`` writes in the background after a host copy, as
    :func:`hvdkit.torch.save_checkpoint` describes.
    """
    ctx = current()
    sharded = optimizer is not None and sharded_part(optimizer) is not None

    def gather() -> dict | None:
        if not ctx.is_main and not sharded:
            return None
        named = named_variables(model, optimizer)
        # A sharded optimizer's slots are gathered on rank 0 from every rank (collective: every rank calls this).
        if sharded:
            check_same_loads(optimizer, backend(), "hk.save_checkpoint")
        whole = gather_whole([v for _, v in named], root=0) if sharded else [variable_numpy(v) for _, v in named]
        return None if whole is None else dict(zip((n for n, _ in named), whole))

    def build(header: dict, values: dict, snapshot: bool):
        if snapshot:       # Keras on torch reads a CPU variable without a copy: training would change the file
            values = {n: np.array(v, copy=True) for n, v in values.items()}
        model_names = [n for n in values if n.startswith("model/")]
        opt_names = [n for n in values if n.startswith("optimizer/")]
        model_vars, opt_vars = [values[n] for n in model_names], [values[n] for n in opt_names]
        header = {**header, "backend": ctx.mode, "n_model": len(model_vars), "n_optimizer": len(opt_vars),
                  "model_names": model_names, "optimizer_names": opt_names}
        header = json.loads(json.dumps(header))      # hash what a load will see (tuples become lists)
        arrays = {f"model_{i}": a for i, a in enumerate(model_vars)}
        arrays.update({f"optimizer_{i}": a for i, a in enumerate(opt_vars)})

        def write(f):
            header[DIGEST_KEY] = content_digest({"header": header, "model": model_vars, "optimizer": opt_vars})
            np.savez(f, **arrays, header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8))   # last, as before

        return write, sum(a.nbytes for a in arrays.values())

    return checkpoint.save(path, adapter=ADAPTER, fmt=FORMAT, suffix=".npz", optimizer=optimizer, gather=gather,
                           build=build, verify=_read, step=step, keep_last=keep_last, extra=extra, blocking=blocking)


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
    verify_loaded(path, header.get("format"), FORMAT, {**body, DIGEST_KEY: stored})
    return body


def check_checkpoint_path(path: str | os.PathLike, model=None, optimizer=None, keep_last: int | None = None) -> None:
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

    check_on_root(path, need, backend(), keep_last=keep_last, suffix=".npz")


def load_checkpoint(path: str | os.PathLike, model, optimizer=None, root_rank: int = 0, *,
                    on_resize: str = "rescale", missing_ok: bool = False) -> dict | None:
    """Rank ``root_rank`` reads ``path``; every rank assigns the same variables, by name. Returns ``extra``.

    A variable the checkpoint lacks, one it has that the model lacks, or one
    of another shape raises :class:`CheckpointError` naming it (on every rank).
    A checkpoint of another world size resumes with the learning rate
    ``scale_lr`` gives for this one (``on_resize="error"`` refuses it), as in
    :func:`hvdkit.torch.load_checkpoint` (also ``missing_ok``).
    """
    where = os.fspath(path)

    def apply(body: dict) -> None:
        for part, target in (("model", model), ("optimizer", optimizer)):
            if target is None:
                continue
            named = [(n, v) for n, v in named_variables(model, optimizer) if n.startswith(part + "/")]
            _assign_by_name(where, part, named, dict(zip(body["header"][f"{part}_names"], body[part])))

    def set_rates(body: dict, factor: float) -> tuple[float, float] | None:
        # Keras 3 saves the rate among the optimizer's variables, so the file's (old) rate was just assigned;
        # tf-keras does not, and its optimizer keeps the rate the script gave it for this size.
        if factor == 1.0 or not saves_learning_rate(optimizer):
            return None
        before = get_learning_rate(optimizer)
        set_learning_rate(optimizer, before * factor)
        return before, before * factor

    return checkpoint.load(path, adapter=ADAPTER, suffix=".npz", read=_read, header_of=lambda body: body["header"],
                           apply=apply, optimizer=optimizer, set_rates=set_rates, root_rank=root_rank,
                           on_resize=on_resize, missing_ok=missing_ok)


def _assign_by_name(path: str, part: str, named: list, values: dict) -> None:
    missing = [n for n, _ in named if n not in values]
    unexpected = sorted(set(values) - {n for n, _ in named})
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {path!r} does not match this {part}: missing {missing[:3]}, unexpected {unexpected[:3]}; "
            "build the same architecture as the saving script (Keras numbers unnamed layers per process, "
            "so give layers name= when models are built in a different order)")
    for name, variable in named:
        if tuple(values[name].shape) != tuple(variable.shape):
            raise CheckpointError(f"checkpoint {path!r}: {name!r} is {tuple(values[name].shape)} there but "
                                  f"{tuple(variable.shape)} here: build the same architecture before loading")
        variable.assign(values[name])
