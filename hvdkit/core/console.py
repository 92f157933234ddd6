"""Rank-aware console output: rank-tagged logging and a rank-0 progress bar.

Example::

    log = get_logger(rank=ctx.rank, size=ctx.size)
    log.info("starting")                       # "[rank 0/2] starting"
    for batch in progress(loader, rank=ctx.rank, desc="epoch 1"):
        ...
"""

from __future__ import annotations

import logging
import sys
from typing import Iterable, TypeVar

T = TypeVar("T")


def get_logger(rank: int, size: int, name: str = "hvdkit", level: int = logging.INFO) -> logging.Logger:
    """A logger whose lines start with ``[rank R/N]`` so interleaved output stays readable."""
    logger = logging.getLogger(f"{name}.rank{rank}")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"[rank {rank}/{size}] %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level)
    return logger


def progress(iterable: Iterable[T], rank: int, desc: str = "", total: int | None = None,
             **tqdm_kwargs) -> Iterable[T]:
    """A tqdm progress bar on rank 0 only; other ranks iterate silently."""
    from tqdm.auto import tqdm  # imported here so the core loads without tqdm

    return tqdm(iterable, desc=desc, total=total, disable=rank != 0, leave=False,
                dynamic_ncols=True, **tqdm_kwargs)
