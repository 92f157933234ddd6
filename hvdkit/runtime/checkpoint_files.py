"""Checkpoint files, framework-neutral: keep-last-N, fallback and pre-flight checks.

A checkpoint is written whole or not at all (:func:`hvdkit.common.files.atomic_write`).
Its integrity check is inside the file (:mod:`hvdkit.runtime.integrity`),
so that one rename makes the file and its check valid together; the temporary
files a killed save leaves behind are removed by the next save to that place.

Example::

    write_checkpoint_file("ckpt.pt", lambda f: torch.save(state, f))     # CheckpointError on a full disk
    CheckpointDir("ckpts", suffix=".pt", keep_last=3).save(step, lambda f: torch.save(state, f))
"""

from __future__ import annotations

import glob
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable

from hvdkit.common.files import (
    WriteError,
    atomic_write,
    cannot_write,
    remove_leftovers,
    writable_free_bytes,
)
from hvdkit.common.units import format_bytes
from hvdkit.runtime.backend import Backend
from hvdkit.runtime.integrity import TensorBytes, check_digest, numpy_bytes

log = logging.getLogger("hvdkit.checkpoint")


class CheckpointError(WriteError):
    """A checkpoint cannot be saved or loaded; the adapters raise it on every rank alike.

    ``cause`` is what is wrong with one file, without the fix, for a message that lists several files.
    """

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause or message


# The fix for a checkpoint that is not there, in a user's script and in the examples.
START_FRESH = "pass missing_ok=True to start from scratch when there is none (the examples: leave out --resume)"


def check_writable(path: str | os.PathLike, need_bytes: int = 0, keep_last: int | None = None,
                   suffix: str = "") -> str | None:
    """None when a checkpoint of about ``need_bytes`` can be saved at ``path``; else the one-line reason and fix.

    Creates the directory, writes and removes a probe file, and compares the
    free space with ``need_bytes``: run it before training, not after the
    first epoch. With ``keep_last`` (a directory) the budget is what the
    directory will hold: ``keep_last`` checkpoints and the one being written,
    less those already there (counted with ``suffix``).
    """
    path = os.fspath(path)
    directory = path if is_directory_target(path) else os.path.dirname(os.path.abspath(path))
    try:
        free = writable_free_bytes(directory)
    except OSError as exc:
        return cannot_write(path, exc, "checkpoint").replace("; the previous checkpoint is untouched", "")
    copies, what = 1, "a checkpoint of this model needs"
    if keep_last and is_directory_target(path):
        there = min(len(CheckpointDir(directory, suffix).checkpoints()), keep_last) if suffix else 0
        copies = keep_last + 1 - there
        what = (f"keep_last={keep_last} checkpoints of this model need ({keep_last} kept and the one being "
                f"written{f', {there} already there' if there else ''}: {copies} x {format_bytes(need_bytes)})")
    if need_bytes and free < need_bytes * copies:
        return (f"checkpoint directory {directory!r} has {format_bytes(free)} free but {what} about "
                f"{format_bytes(need_bytes * copies)}: free space there or choose another --checkpoint path")
    return None


# ---- files, directories of checkpoints, fallback --------------------------------------------


def write_checkpoint_file(path: str | os.PathLike, write: Callable[[BinaryIO], None],
                          need_bytes: int | None = None) -> None:
    """Atomic write of a self-verifying checkpoint (``write`` embeds the digest)."""
    path = os.fspath(path)
    atomic_write(path, write, what="checkpoint", need_bytes=need_bytes, error=CheckpointError)
    _KNOWN_GOOD[os.path.realpath(path)] = _stamp(path)


# Checkpoints this process wrote or verified, by (size, mtime): pruning trusts them without reading them again.
_KNOWN_GOOD: dict[str, tuple[int, int]] = {}


def _stamp(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


@dataclass
class Selection:
    path: str
    payload: Any
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (path, reason), newest first


class CheckpointDir:
    """A directory of ``<prefix>-<step>.<ext>`` checkpoints with keep-last-N and fallback.

    Example::

        ckpts = CheckpointDir("ckpts", suffix=".pt", keep_last=3)
        ckpts.save(step=12, write=lambda f: torch.save(state, f))     # ckpts/ckpt-00000012.pt
        chosen = ckpts.select(load=read_and_verify)                   # newest that loads and verifies
    """

    def __init__(self, directory: str | os.PathLike, suffix: str, prefix: str = "ckpt", keep_last: int | None = None,
                 verify: Callable[[str], Any] | None = None):
        if keep_last is not None and keep_last < 1:
            raise CheckpointError(f"keep_last must be >= 1, got {keep_last}: keep at least the newest checkpoint")
        self.directory = os.fspath(directory)
        self.prefix, self.suffix, self.keep_last = prefix, suffix, keep_last
        self.verify = verify            # the adapter's read-and-verify: raises on a damaged checkpoint
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

    def save(self, step: int, write: Callable[[BinaryIO], None], need_bytes: int | None = None) -> str:
        path = self.path_for(step)
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(cannot_write(path, exc, "checkpoint")) from exc
        self.remove_leftovers()
        write_checkpoint_file(path, write, need_bytes)
        self.prune(keep=path)
        return path

    def remove_leftovers(self) -> list[str]:
        """Temporary files of killed saves of any step (``.ckpt-00000005.pt.<random>.tmp``)."""
        return remove_leftovers(os.path.join(self.directory, ""), "checkpoint", CheckpointError,
                                name_glob=f"{glob.escape(self.prefix)}-*{glob.escape(self.suffix)}")

    def prune(self, keep: str | None = None) -> list[str]:
        """Keep the newest ``keep_last`` checkpoints that verify, and ``keep``; delete the older ones.

        One that fails to verify does not count: saving step 12 beside a good 5
        and a damaged 9 with ``keep_last=2`` kept the damaged 9 and deleted 5,
        the only good checkpoint before 12. It is not deleted either while it
        is newer than the last one kept (a read can fail for reasons of its own:
        memory, an I/O error), only once older ones are. Each file is read to
        verify it at most once a process (those this process wrote are known
        good), and only until ``keep_last`` good ones are found. ``keep`` (the
        file just written) stays whatever its step.
        """
        if self.keep_last is None:
            return []
        kept, removed = 0, []
        for path in self.checkpoints():
            if path == keep or (kept < self.keep_last and self._good(path)):
                kept += 1
            elif kept >= self.keep_last:
                removed.append(path)
        for path in removed:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        return removed

    def _good(self, path: str) -> bool:
        if self.verify is None or _KNOWN_GOOD.get(os.path.realpath(path)) == _stamp(path):
            return True
        try:
            self.verify(path)
        except Exception as exc:  # noqa: BLE001 - any failure to read and verify: it does not count
            log.warning("checkpoint %s does not verify (%s): it does not count towards keep_last", path,
                        str(exc)[:200])
            return False
        _KNOWN_GOOD[os.path.realpath(path)] = _stamp(path)
        return True

    def select(self, load: Callable[[str], Any]) -> Selection:
        """The newest checkpoint that ``load`` reads and verifies; warns for each newer one skipped.

        ``load(path)`` returns the payload or raises: :class:`CheckpointError`
        with the reason (damaged, wrong format) or any other exception.
        """
        skipped: list[tuple[str, str]] = []
        for path in self.checkpoints():
            try:
                payload = load(path)
            except CheckpointError as exc:        # the loader's own check failed: try an older one
                reason = exc.cause
            except Exception as exc:
                reason = f"does not load ({type(exc).__name__}: {exc})"
            else:
                for bad, why in skipped:
                    log.warning("checkpoint %s skipped: %s", bad, why)
                if skipped:
                    log.warning("resuming from %s instead", path)
                return Selection(path, payload, skipped)
            skipped.append((path, reason))
        if not skipped:
            raise CheckpointError(f"no checkpoints in {self.directory!r}: check the directory, or {START_FRESH}")
        detail = "; ".join(f"{os.path.basename(p)}: {why}" for p, why in skipped)
        raise CheckpointError(f"no usable checkpoint in {self.directory!r} ({detail}): restore one from a "
                              "backup, or move them aside to start from scratch")


def unreadable(path: str, exc: BaseException) -> CheckpointError:
    """The error for a checkpoint the framework's loader cannot read (the same words in both adapters)."""
    cause = f"checkpoint {path!r} is unreadable or corrupt ({type(exc).__name__})"
    return CheckpointError(f"{cause}: restore an older checkpoint, or move it aside to start from scratch", cause)


def verify_loaded(path: str, found_format: Any, fmt: str, content: Any,
                  tensor_bytes: TensorBytes = numpy_bytes) -> None:
    """Raise unless ``content`` (what a load read, digest included) is an intact checkpoint of format ``fmt``."""
    kind = fmt.rsplit("/", 1)[0]
    if isinstance(found_format, str) and found_format.startswith(kind + "/") and found_format != fmt:
        raise CheckpointError(f"{path!r} is an {found_format} checkpoint, a format this hvdkit does not read (it "
                              f"reads {fmt}): load it with the hvdkit that wrote it and save it again")
    if found_format != fmt:
        raise CheckpointError(f"{path!r} is not an {kind} checkpoint: save it with {kind}.save_checkpoint")
    why = check_digest(content, tensor_bytes)
    if why is not None:
        raise damaged(path, why)


def damaged(path: str, why: str) -> CheckpointError:
    """The error for a checkpoint that fails its integrity check (the same words in both adapters)."""
    cause = f"checkpoint {path!r} is damaged: {why}"
    return CheckpointError(f"{cause}; restore an older checkpoint, or save into a directory (a path ending in '/') "
                           "so resume falls back to the newest good one", cause)


def is_directory_target(path: str | os.PathLike) -> bool:
    path = os.fspath(path)
    return path.endswith(os.sep) or os.path.isdir(path)


def save_to(path: str | os.PathLike, write: Callable[[BinaryIO], None], suffix: str,
            step: int | None, keep_last: int | None, verify: Callable[[str], Any] | None = None,
            need_bytes: int | None = None) -> str:
    """Save to a file, or into a checkpoint directory as ``ckpt-<step>``; ``write`` embeds the digest.

    ``verify(path)`` reads and verifies an older checkpoint, so keep-last-N
    never counts a damaged one; ``need_bytes`` (an estimate of the file's
    size) goes into the message when the disk fills up mid-save.
    """
    if is_directory_target(path):
        if step is None:
            raise CheckpointError(f"{os.fspath(path)!r} is a directory: pass step= (e.g. the epoch) to name the "
                                  "checkpoint")
        return CheckpointDir(path, suffix, keep_last=keep_last, verify=verify).save(step, write, need_bytes)
    if keep_last is not None:
        raise CheckpointError("keep_last needs a checkpoint directory: pass a path ending in '/'")
    write_checkpoint_file(path, write, need_bytes)
    return os.fspath(path)


def read_from(path: str | os.PathLike, read: Callable[[str], Any], suffix: str) -> tuple[str, Any]:
    """(chosen file, payload): the newest good checkpoint of a directory, or one file.

    ``read(path)`` loads and verifies (see :func:`CheckpointDir.select`).
    Raises :class:`CheckpointError` naming the cause and the fix.
    """
    path = os.fspath(path)
    if is_directory_target(path):
        chosen = CheckpointDir(path, suffix).select(read)
        return chosen.path, chosen.payload
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist: check the path, or {START_FRESH}")
    return path, read(path)


def check_on_root(path: str | os.PathLike, need_bytes: Callable[[], int], backend: Backend,
                  root_rank: int = 0, keep_last: int | None = None, suffix: str = "") -> None:
    """The root runs :func:`check_writable` and a broadcast through ``backend`` hands every rank the verdict.

    Every rank raises the same :class:`CheckpointError` when the place is
    unusable. ``need_bytes()`` (the checkpoint's estimated size) runs on the
    root only.
    """
    problem = check_writable(path, need_bytes(), keep_last, suffix) if backend.rank() == root_rank else None
    problem = backend.broadcast_object(problem, root_rank, name="hvdkit.check_checkpoint_path")
    if problem is not None:
        raise CheckpointError(problem)


def has_checkpoint(path: str | os.PathLike, suffix: str) -> bool:
    """Whether ``path`` holds something to resume from: the file, or a directory's ``ckpt-<step>`` files."""
    path = os.fspath(path)
    if is_directory_target(path):
        return bool(CheckpointDir(path, suffix).checkpoints())
    return os.path.exists(path)


def read_on_root(path: str | os.PathLike, read: Callable[[str], Any], suffix: str, backend: Backend,
                 root_rank: int = 0, missing_ok: bool = False) -> Any:
    """The root reads the checkpoint (:func:`read_from`) and a broadcast through ``backend`` hands out its payload.

    A failure travels in the same broadcast, so every rank raises the same
    :class:`CheckpointError` and none is left waiting for a payload. With
    ``missing_ok`` an absent checkpoint (no file, or a directory without
    checkpoints: a requeued job's first run) gives None on every rank; a
    damaged one still raises.
    """
    message = None
    if backend.rank() == root_rank:
        try:
            if missing_ok and not has_checkpoint(path, suffix):
                message = ("missing", None)
            else:
                message = ("ok", read_from(path, read, suffix)[1])
        except CheckpointError as exc:
            message = ("error", str(exc))
    status, body = backend.broadcast_object(message, root_rank, name="hvdkit.checkpoint")
    if status == "error":
        raise CheckpointError(body)
    return body
