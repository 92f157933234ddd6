"""Checkpoint files, framework-neutral: atomic writes and the rank-0 policy.

A checkpoint is written to a temporary file in the same directory, flushed and
fsync'ed, then renamed over the target. ``os.replace`` is atomic on POSIX, so a
process killed mid-save leaves either the old checkpoint or the new one, never a
truncated file.

Example::

    atomic_write("ckpt.pt", lambda f: torch.save(state, f))
"""

from __future__ import annotations

import os
import tempfile
from typing import BinaryIO, Callable


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(file)`` on a temporary file, then atomically move it to ``path``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    # Make the rename itself durable.
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
