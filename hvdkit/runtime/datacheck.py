"""Did every rank get the same training data? An order-independent answer, gathered once.

A script that forgets to shard trains every rank on all of the data: the
job is no faster than one process and nothing fails. Each adapter computes
a fingerprint of the data its rank is about to train on (Keras: the arrays
given to ``fit``; torch: the dataset behind an unsharded ``DataLoader``),
the ranks gather them once, and rank 0 warns when all are equal.

The fingerprint of arrays is a multiset hash of their rows: each row is
hashed on its own and the row hashes are added modulo 2**64, so the same
rows in any order (a script that shuffled before ``fit``, each rank with
its own permutation) give the same value, while shards that differ in one
row differ. Rows longer than 256 words are hashed on 256 evenly spaced
words, so the cost is one pass over at most 2 KiB per row (measured in
docs/RELIABILITY.md).

Example::

    fingerprint = rows_fingerprint([x_train, y_train])       # None for data it cannot read
    if same_everywhere(backend, fingerprint, "hvdkit.fit_data"): warn(...)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hvdkit.runtime.backend import Backend

WORDS_PER_ROW = 256              # at most this many 8-byte words of a row are hashed
CHUNK_BYTES = 32 * 2**20         # rows are hashed this many bytes at a time (bounded extra memory)
_MASK = np.uint64(2**64 - 1)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise: a linear row hash becomes a well-spread one."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _row_words(rows: np.ndarray) -> np.ndarray:
    """Each row's bytes as uint64 words (zero-padded), at most WORDS_PER_ROW of them, evenly spaced."""
    raw = np.ascontiguousarray(rows).reshape(len(rows), -1).view(np.uint8)
    pad = (-raw.shape[1]) % 8
    if pad:
        raw = np.concatenate([raw, np.zeros((len(raw), pad), np.uint8)], axis=1)
    words = raw.view(np.uint64)
    if words.shape[1] > WORDS_PER_ROW:
        words = words[:, np.linspace(0, words.shape[1] - 1, WORDS_PER_ROW).astype(np.intp)]
    return words


def array_rows_hash(array: np.ndarray, seed: int) -> np.ndarray:
    """A uint64 hash of each row of ``array`` (rows are its first axis)."""
    n = len(array)
    out = np.empty(n, np.uint64)
    row_bytes = max(1, array.nbytes // max(n, 1))
    step = max(1, CHUNK_BYTES // row_bytes)
    with np.errstate(over="ignore"):
        for start in range(0, n, step):
            words = _row_words(array[start:start + step])
            keys = _mix(np.arange(1, words.shape[1] + 1, dtype=np.uint64) + np.uint64(seed)) | np.uint64(1)
            out[start:start + step] = _mix((words * keys).sum(axis=1, dtype=np.uint64) + np.uint64(words.shape[1]))
    return out


def rows_fingerprint(arrays: Sequence[Any]) -> str | None:
    """An order-independent fingerprint of the rows of ``arrays`` (paired row by row); None if not numpy arrays.

    Row i of every array is hashed together, so (x, y) pairs count as one
    row; the row hashes are summed modulo 2**64, which ignores their order.
    """
    if not arrays or not all(isinstance(a, np.ndarray) and a.ndim and a.dtype != object for a in arrays):
        return None
    if len({len(a) for a in arrays}) != 1:
        return None
    with np.errstate(over="ignore"):
        rows = np.zeros(len(arrays[0]), np.uint64)
        for i, a in enumerate(arrays):
            rows = _mix(rows + array_rows_hash(a, seed=i + 1))
        total = int(rows.sum(dtype=np.uint64))
    shapes = ";".join(f"{a.dtype.str}{a.shape}" for a in arrays)
    return f"{shapes}:{total:016x}"


def same_everywhere(backend: Backend, fingerprint: str | None, name: str) -> bool:
    """Gather every rank's fingerprint (collective: every rank calls it); True when all are equal and not None."""
    gathered = backend.allgather_object(fingerprint, name=name)
    return len(gathered) > 1 and gathered[0] is not None and len(set(gathered)) == 1
