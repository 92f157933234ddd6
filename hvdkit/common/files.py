"""Files written whole or not at all: atomic writes, leftovers of killed writes, free space (checkpoints and results).

A file is written to a temporary file in the same directory, flushed and
fsync'ed, then renamed over the target. ``os.replace`` is atomic on POSIX, so
a process killed mid-write leaves either the old file or the new one, never a
truncated one; the temporary files a killed write leaves behind are removed by
the next write to that place. Checkpoints (:mod:`hvdkit.runtime.checkpoint_files`)
and benchmark results (:mod:`hvdkit.bench.report`) are both written here.

Example::

    atomic_write("results.json", lambda f: f.write(data), what="results")
"""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import logging
import os
import shutil
import tempfile
from typing import BinaryIO, Callable

from hvdkit.common.errors import UserError
from hvdkit.common.units import format_bytes

log = logging.getLogger("hvdkit.files")


class WriteError(UserError):
    """A file cannot be written; the message names it, the cause and the fix, and the previous file is untouched."""


# tempfile.mkstemp's random part is 8 characters: ".model.pt.<8>.tmp" is a save of model.pt, while
# ".model.pt.best.<8>.tmp" belongs to model.pt.best and is left alone.
_RANDOM = "????????"


def remove_leftovers(path: str | os.PathLike, what: str = "file", error: type[WriteError] = WriteError,
                     name_glob: str | None = None) -> list[str]:
    """Delete the temporary files earlier, killed writes to ``path`` left behind (see :func:`_remove_dead`).

    ``name_glob`` (a pattern for the file's name, ``ckpt-*.pt``) widens this to
    every file of ``path``'s directory that it matches.
    """
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    name = name_glob if name_glob is not None else glob.escape(os.path.basename(path))
    pattern = os.path.join(glob.escape(directory), f".{name}.{_RANDOM}.tmp")
    removed = [tmp for tmp in glob.glob(pattern) if _remove_dead(tmp, path, what, error)]
    if removed:
        log.info("removed %d temporary file(s) of an interrupted save: %s", len(removed), ", ".join(removed))
    return removed


def _remove_dead(tmp: str, target: str, what: str = "file", error: type[WriteError] = WriteError) -> bool:
    """Delete ``tmp`` if no live process writes it; raise ``error`` naming the writer if one does.

    Every save holds an ``flock`` on its own temporary file while writing it,
    and the kernel drops the lock when the process ends. A save that removed
    another's temporary files unconditionally deleted a live one when two
    processes saved to the same place at once: about half the saves failed
    with "No such file or directory: check the path". A file the lock cannot
    be taken on (a file system without locks) is removed, as before.
    """
    try:
        fd = os.open(tmp, os.O_RDWR)
    except FileNotFoundError:
        return False
    except OSError:
        fd = None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise error(
                    f"another process is writing {what} {target!r} right now ({os.path.basename(tmp)}): two jobs "
                    "(or two ranks of one) save to the same place; give each job its own path (hvdkit's "
                    "save_checkpoint writes on rank 0 only)") from None
            except OSError:
                pass                  # no locks here (some NFS setups): remove it, as before
        try:
            os.unlink(tmp)
            return True
        except FileNotFoundError:
            return False
    finally:
        if fd is not None:
            os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None], what: str = "file",
                 need_bytes: int | None = None, error: type[WriteError] = WriteError) -> None:
    """Call ``write(file)`` on a temporary file, then atomically move it to ``path``.

    An OSError (read-only directory, full disk, quota) becomes ``error`` (a
    :class:`WriteError`) that names ``what``, the path and the fix; the
    temporary file is removed and the previous ``path`` is untouched. So does
    any other error while the disk is full: ``torch.save`` reports ENOSPC as
    ``RuntimeError: [enforce fail at inline_container.cc:672] . unexpected
    pos``, which an ``except`` of the error missed; the message
    gives ``need_bytes`` (the adapter's estimate) against the free space.
    The temporary file is ``flock``-ed while it is written, so no other save
    takes it for a killed save's leftover (:func:`_remove_dead`).
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise error(cannot_write(path, exc, what)) from exc
    try:
        remove_leftovers(path, what, error)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise error(cannot_write(path, exc, what)) from exc
    try:
        # mkstemp makes the file 0600: a checkpoint teammates on a shared cluster could not read, where
        # torch.save and Keras give what the umask allows, as open() does (0644 under the usual 022).
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)    # ours, until the file is closed
            except OSError:
                pass              # no locks on this file system
            write(f)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)     # still open, so still locked: no other save can take it for a leftover
    except BaseException as exc:
        written = os.path.getsize(tmp) if os.path.exists(tmp) else 0
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise error(cannot_write(path, exc, what)) from exc
        if isinstance(exc, Exception) and _disk_full(directory, written):
            raise error(_disk_filled(path, what, written, need_bytes, directory)) from exc
        raise
    # Make the rename itself durable.
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc/self/status, Linux >= 4.7)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)        # elsewhere the only way to read it is to set it, for an instant
    os.umask(mask)
    return mask


def _disk_full(directory: str, written: int) -> bool:
    """After a failed write: was the file system full? (Less free than a block-sized margin, the tmp removed.)"""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return False
    return free - written < 1 << 20


def _disk_filled(path: str, what: str, written: int, need_bytes: int | None, directory: str) -> str:
    free = shutil.disk_usage(directory).free
    need = f"; this {what} needs about {format_bytes(need_bytes)}" if need_bytes else ""
    return (f"cannot write {what} {path!r}: the disk filled up after {format_bytes(written)} ({format_bytes(free)} "
            f"free now{need}): free space there or save elsewhere; the previous {what} is untouched")


def cannot_write(path: str, exc: OSError, what: str = "file") -> str:
    fix = {errno.ENOSPC: "free space there or save elsewhere",
           errno.EDQUOT: "free space in your quota or save elsewhere",
           errno.EROFS: "save to a writable file system",
           errno.EACCES: "save to a directory you can write to, or fix its permissions"}
    return (f"cannot write {what} {path!r}: {exc.strerror or exc} (errno {exc.errno}): "
            f"{fix.get(exc.errno, 'check the path and the file system')}; the previous {what} is untouched")


def writable_free_bytes(directory: str) -> int:
    """Create ``directory``, write and remove a probe file in it, and return its free bytes.

    Raises the OSError that a save there would meet (read-only, no permission, a file in the path).
    """
    os.makedirs(directory, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".hvdkit-write-probe.", suffix=".tmp", dir=directory)
    os.close(fd)
    os.unlink(probe)
    return shutil.disk_usage(directory).free



def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
