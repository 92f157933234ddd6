"""Tensor-tree helpers shared by the optimizer broadcast and checkpoints."""

from __future__ import annotations

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
