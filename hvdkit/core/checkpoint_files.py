"""Checkpoint files, framework-neutral: atomic writes, checksums, keep-last-N and fallback.

A checkpoint is written to a temporary file in the same directory, flushed and
fsync'ed, then renamed over the target. ``os.replace`` is atomic on POSIX, so a
process killed mid-save leaves either the old checkpoint or the new one, never a
truncated file.

Example::

    atomic_write("ckpt.pt", lambda f: torch.save(state, f))
    CheckpointDir("ckpts", suffix=".pt", keep_last=3).save(step, lambda f: torch.save(state, f))
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable

from hvdkit.core.errors import UserError

log = logging.getLogger("hvdkit.checkpoint")
CHECKSUM_SUFFIX = ".sha256"


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


# ---- checksums, directories of checkpoints, fallback ---------------------------------


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_checkpoint_file(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Atomic write, then an atomic ``<path>.sha256`` beside it.

    The checksum is written last: a checkpoint whose checksum is missing was
    interrupted between the two renames and is not trusted.
    """
    path = os.fspath(path)
    atomic_write(path, write)
    digest = file_sha256(path)
    atomic_write(path + CHECKSUM_SUFFIX, lambda f: f.write(f"{digest}  {os.path.basename(path)}\n".encode()))


def verify_checksum(path: str) -> str | None:
    """None when ``path`` matches its ``.sha256``; otherwise why it does not."""
    if not os.path.exists(path):
        return "missing"
    try:
        with open(path + CHECKSUM_SUFFIX, encoding="utf-8") as f:
            expected = f.read().split()[0]
    except (OSError, IndexError):
        return "no checksum file (the save was interrupted)"
    return None if file_sha256(path) == expected else "checksum mismatch (the file is damaged)"


@dataclass
class Selection:
    path: str
    payload: Any
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (path, reason), newest first


class CheckpointDir:
    """A directory of ``<prefix>-<step>.<ext>`` checkpoints with checksums and keep-last-N.

    Example::

        ckpts = CheckpointDir("ckpts", suffix=".pt", keep_last=3)
        ckpts.save(step=12, write=lambda f: torch.save(state, f))     # ckpts/ckpt-00000012.pt
        chosen = ckpts.select(load=lambda p: torch.load(p))           # newest that verifies and loads
    """

    def __init__(self, directory: str | os.PathLike, suffix: str, prefix: str = "ckpt", keep_last: int | None = None):
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}: keep at least the newest checkpoint")
        self.directory = os.fspath(directory)
        self.prefix, self.suffix, self.keep_last = prefix, suffix, keep_last
        self._pattern = re.compile(rf"^{re.escape(prefix)}-(\d+){re.escape(suffix)}$")

    def path_for(self, step: int) -> str:
        return os.path.join(self.directory, f"{self.prefix}-{step:08d}{self.suffix}")

    def checkpoints(self) -> list[str]:
        """Checkpoint files, newest (highest step) first."""
        found = []
        for path in glob.glob(os.path.join(glob.escape(self.directory), f"{self.prefix}-*{self.suffix}")):
            match = self._pattern.match(os.path.basename(path))
            if match:
                found.append((int(match.group(1)), path))
        return [p for _, p in sorted(found, reverse=True)]

    def save(self, step: int, write: Callable[[BinaryIO], None]) -> str:
        path = self.path_for(step)
        write_checkpoint_file(path, write)
        self.prune()
        return path

    def prune(self) -> list[str]:
        """Delete all but the newest ``keep_last`` checkpoints (and their checksums)."""
        if self.keep_last is None:
            return []
        removed = self.checkpoints()[self.keep_last:]
        for path in removed:
            for p in (path, path + CHECKSUM_SUFFIX):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        return removed

    def select(self, load: Callable[[str], Any]) -> Selection:
        """The newest checkpoint that verifies and loads; warns for each newer one skipped."""
        skipped: list[tuple[str, str]] = []
        for path in self.checkpoints():
            reason = verify_checksum(path)
            if reason is None:
                try:
                    payload = load(path)
                except Exception as exc:          # a loader's own check failed: try an older one
                    reason = f"does not load ({type(exc).__name__}: {exc})"
                else:
                    for bad, why in skipped:
                        log.warning("checkpoint %s skipped: %s", bad, why)
                    if skipped:
                        log.warning("resuming from %s instead", path)
                    return Selection(path, payload, skipped)
            skipped.append((path, reason))
        if not skipped:
            raise FileNotFoundError(f"no checkpoints in {self.directory!r}: check the directory, or start "
                                    "without --resume")
        detail = "; ".join(f"{os.path.basename(p)}: {why}" for p, why in skipped)
        raise ValueError(f"no usable checkpoint in {self.directory!r} ({detail}): restore one from a backup "
                         "or start without --resume")


class CheckpointError(UserError):
    """A checkpoint cannot be saved or loaded; the adapters raise it on every rank alike."""


def is_directory_target(path: str | os.PathLike) -> bool:
    path = os.fspath(path)
    return path.endswith(os.sep) or os.path.isdir(path)


def save_to(path: str | os.PathLike, write: Callable[[BinaryIO], None], suffix: str,
            step: int | None, keep_last: int | None) -> str:
    """Save to a file (with checksum), or into a checkpoint directory as ``ckpt-<step>``."""
    if is_directory_target(path):
        if step is None:
            raise CheckpointError(f"{os.fspath(path)!r} is a directory: pass step= (e.g. the epoch) to name the "
                                  "checkpoint")
        return CheckpointDir(path, suffix, keep_last=keep_last).save(step, write)
    if keep_last is not None:
        raise CheckpointError("keep_last needs a checkpoint directory: pass a path ending in '/'")
    write_checkpoint_file(path, write)
    return os.fspath(path)


def read_from(path: str | os.PathLike, read: Callable[[str], Any], suffix: str) -> tuple[str, Any]:
    """(chosen file, payload): the newest good checkpoint of a directory, or a verified file.

    Raises :class:`CheckpointError` naming the cause and the fix.
    """
    path = os.fspath(path)
    if is_directory_target(path):
        try:
            chosen = CheckpointDir(path, suffix).select(read)
        except (FileNotFoundError, ValueError) as exc:
            raise CheckpointError(str(exc)) from None
        return chosen.path, chosen.payload
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist: check the path, or start without --resume")
    if os.path.exists(path + CHECKSUM_SUFFIX):
        reason = verify_checksum(path)
        if reason is not None:
            raise CheckpointError(f"checkpoint {path!r} is corrupt ({reason}): restore an older checkpoint, "
                                  "or save into a directory so resume falls back automatically")
    return path, read(path)


def read_on_root(path: str | os.PathLike, read: Callable[[str], Any], suffix: str, *, is_root: bool,
                 broadcast: Callable[[Any], Any]) -> Any:
    """The root reads the checkpoint (:func:`read_from`) and ``broadcast`` hands every rank its payload.

    A failure travels in the same broadcast, so every rank raises the same
    :class:`CheckpointError` and none is left waiting for a payload.
    ``broadcast(obj)`` is the framework's broadcast_object from the root.
    """
    message = None
    if is_root:
        try:
            message = ("ok", read_from(path, read, suffix)[1])
        except CheckpointError as exc:
            message = ("error", str(exc))
    status, body = broadcast(message)
    if status == "error":
        raise CheckpointError(body)
    return body
