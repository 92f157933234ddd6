"""Tensor-tree and module helpers shared by the optimizer, its broadcast and checkpoints."""

from __future__ import annotations

import sys

import torch


def to_cpu(obj):
    """A copy of a nested dict/list/tuple of tensors with every tensor detached on the CPU.

    Broadcasts and checkpoints pickle state; CPU tensors load on any device.
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


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
