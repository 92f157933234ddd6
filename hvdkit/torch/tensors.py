"""Tensor-tree and module helpers shared by the optimizer, its broadcast and checkpoints."""

from __future__ import annotations

import copy
import sys

import torch


def to_cpu(obj):
    """A copy of a nested dict/list/tuple of tensors with every tensor detached on the CPU.

    Broadcasts and checkpoints pickle state; CPU tensors load on any device.
    A device tensor under several names (tied weights) is moved once, so the
    pickle holds it once and the names still share it, as CPU tensors do.
    """
    moved = {}

    def walk(o):
        if isinstance(o, torch.Tensor):
            t = o.detach()
            return t if t.device.type == "cpu" else _once_per_view(moved, t, lambda x: x.cpu())
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return type(o)(walk(v) for v in o)
        return o

    return walk(obj)


def host_copy(obj):
    """A copy of a nested dict/list/tuple state in host memory that training cannot change (a background save's).

    CPU tensors are cloned; a GPU tensor is copied into pinned host memory
    (:func:`pinned_like`) without blocking, and one synchronize at the end
    waits for every copy. Other leaves (step counts, hyperparameters) are
    deep-copied. A tensor that appears under several names (tied weights:
    the same view of one storage) is copied once and the copy appears under
    each, so the file stores it once, as a blocking save on the CPU does.
    Two different views of one storage (a slice and its whole) get a copy
    each: the values load the same, unshared.
    """
    on_device = []
    copies = {}

    def copy_tensor(t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "cpu":
            return t.clone()
        if t.layout != torch.strided:          # sparse: no pinned buffer of its shape; a plain copy
            return t.cpu()
        out = pinned_like(t)
        out.copy_(t, non_blocking=True)
        on_device.append(t.device)
        return out

    def walk(o):
        if isinstance(o, torch.Tensor):
            return _once_per_view(copies, o.detach(), copy_tensor)
        if isinstance(o, dict):
            out = copy.copy(o)            # the same mapping type (an OrderedDict, a defaultdict) with copied values
            for k, v in o.items():
                out[k] = walk(v)
            return out
        if isinstance(o, tuple) and hasattr(o, "_fields"):       # a namedtuple
            return type(o)(*(walk(v) for v in o))
        if isinstance(o, (list, tuple)):
            return type(o)(walk(v) for v in o)
        return copy.deepcopy(o)

    out = walk(obj)
    for device in {d for d in on_device if d.type == "cuda"}:
        torch.cuda.synchronize(device)
    return out


def _once_per_view(made: dict, t: torch.Tensor, make):
    """``make(t)``, made once per view of memory (:func:`_view_key`) and shared by every name that holds that view.

    ``made`` maps a view to (the tensor, kept alive so that its address is not reused meanwhile; what was made)."""
    view = _view_key(t)
    if view is None:
        return make(t)
    if view not in made:
        made[view] = (t, make(t))
    return made[view][1]


def _view_key(t: torch.Tensor):
    """What makes two tensors the same view of the same memory, or None where a tensor is copied alone: empty,
    sparse, quantized or nested tensors, and subclasses without plain storage (a wrapper's address may be 0)."""
    if t.layout != torch.strided or not t.numel() or t.is_quantized or t.is_nested:
        return None
    try:
        address = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    if not address:
        return None
    return (type(t), t.device, address, t.storage_offset(), t.dtype, t.shape, t.stride(), t.is_conj(), t.is_neg())


def pinned_like(t: torch.Tensor) -> torch.Tensor:
    """An empty page-locked host tensor of ``t``'s shape and dtype: the device copies into it asynchronously."""
    return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)


def plain_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module ``torch.compile`` wrapped, else ``model`` itself.

    A compiled model's ``state_dict`` and parameter names carry an
    ``_orig_mod.`` prefix; going through the original module keeps names,
    broadcasts and checkpoints the same whether a script compiles (before or
    after wrapping the optimizer) or not, so a checkpoint written by a
    compiled run loads into a plain model for inference and back.
    """
    dynamo = sys.modules.get("torch._dynamo")       # not imported: nothing can have been compiled
    return model._orig_mod if dynamo and isinstance(model, dynamo.eval_frame.OptimizedModule) else model
