"""Console output: rank-tagged logging, a rank-0 progress bar, and aligned text tables.

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


class _LineWriter:
    """A file for tqdm that turns its carriage-return redraws into whole lines.

    horovodrun reads each rank's output line by line and prefixes it, so the
    ``\r`` redraws of a normal bar pile up into one unreadable line. Here each
    redraw becomes its own line; ``mininterval`` keeps them few.
    """

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        for part in text.replace("\r", "\n").split("\n"):
            if part.strip():
                self.stream.write(part.rstrip() + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress(iterable: Iterable[T], rank: int, desc: str = "", total: int | None = None,
             **tqdm_kwargs) -> Iterable[T]:
    """A tqdm progress bar on rank 0 only; other ranks iterate silently.

    On a terminal it redraws in place; when output is piped (always, under
    horovodrun) it prints a line every few seconds and one at the end.
    """
    from tqdm.auto import tqdm  # imported here so the core loads without tqdm

    options = dict(desc=desc, total=total, disable=rank != 0, dynamic_ncols=True)
    if not sys.stderr.isatty():
        options.update(file=_LineWriter(sys.stderr), mininterval=5.0, ncols=80, leave=True)
    else:
        options.update(leave=False)
    options.update(tqdm_kwargs)
    return tqdm(iterable, **options)


def text_table(rows: list[list[str]] | list[tuple[str, ...]], align: str = "") -> str:
    """Rows of cells as aligned columns two spaces apart, a row a line.

    ``align`` has one letter a column, ``l`` or ``r`` (missing letters mean
    ``r``: numbers line up). Short rows are allowed; trailing spaces are cut.
    """
    columns = max((len(row) for row in rows), default=0)
    widths = [max((len(row[i]) for row in rows if i < len(row)), default=0) for i in range(columns)]
    align = align.ljust(columns, "r")
    return "\n".join("  ".join(cell.ljust(w) if a == "l" else cell.rjust(w)
                               for cell, w, a in zip(row, widths, align)).rstrip() for row in rows)
