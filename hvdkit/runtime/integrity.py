"""A checkpoint's own integrity check: a SHA-256 over its content, stored inside the same file.

A checksum in a sidecar file (``ckpt.pt.sha256``) fails two ways: a copy made
without the sidecar is never verified, and a crash between writing the file
and writing its sidecar leaves a good file beside a stale checksum. So the
digest travels in the checkpoint itself: the adapters compute it over the
state they save (every tensor's dtype, shape and bytes, and every other value)
and store it under :data:`DIGEST_KEY`; one atomic rename makes the file and
its check valid together. Loading recomputes the digest over what was read.

The digest is over the *content*, not the file's bytes, so it survives being
re-read by any loader and needs no second pass over the file; a flipped bit in
a tensor changes the bytes hashed, a flipped bit in the structure either stops
the file loading or changes what is hashed.

Example::

    state["integrity"] = content_digest(state_without_digest, tensor_bytes=torch_tensor_bytes)
    ...
    problem = check_digest(loaded_state, tensor_bytes=torch_tensor_bytes)   # None when intact
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from hvdkit.common.errors import UserError

DIGEST_KEY = "integrity"
ALGORITHM = "sha256-content/1"

# tensor_bytes(obj) -> (a header naming dtype and shape, the raw bytes) for a framework
# tensor, or None for anything else.
TensorBytes = Callable[[Any], "tuple[str, bytes | memoryview] | None"]


def numpy_bytes(obj: Any) -> tuple[str, memoryview] | None:
    if isinstance(obj, (np.ndarray, np.generic)):
        array = np.ascontiguousarray(obj)
        return f"{array.dtype.str}{array.shape}", memoryview(array.reshape(-1).view(np.uint8))
    return None


def content_digest(state: Any, tensor_bytes: TensorBytes = numpy_bytes) -> dict[str, str]:
    """``{"algorithm", "sha256"}`` over ``state``: nested dicts, lists, tuples, scalars and tensors."""
    h = hashlib.sha256()
    _feed(h, state, tensor_bytes)
    return {"algorithm": ALGORITHM, "sha256": h.hexdigest()}


def check_digest(state: Mapping, tensor_bytes: TensorBytes = numpy_bytes) -> str | None:
    """None when ``state[DIGEST_KEY]`` matches the rest of ``state``; otherwise what is wrong."""
    stored = state.get(DIGEST_KEY)
    if not isinstance(stored, Mapping) or stored.get("algorithm") != ALGORITHM:
        return f"it carries no {ALGORITHM} digest"
    rest = {k: v for k, v in state.items() if k != DIGEST_KEY}
    actual = content_digest(rest, tensor_bytes)["sha256"]
    if actual != stored.get("sha256"):
        return (f"its content does not match the digest stored in it (sha256 {actual[:12]}... against "
                f"{str(stored.get('sha256'))[:12]}...): the file was damaged after it was written")
    return None


def _feed(h, obj: Any, tensor_bytes: TensorBytes) -> None:
    raw = tensor_bytes(obj)
    if raw is None and tensor_bytes is not numpy_bytes:
        raw = numpy_bytes(obj)
    if raw is not None:
        header, data = raw
        h.update(b"T" + header.encode() + struct.pack("<Q", len(data)))
        h.update(data)
    elif isinstance(obj, Mapping):
        h.update(b"D" + struct.pack("<Q", len(obj)))
        for key, value in obj.items():
            _feed(h, key, tensor_bytes)
            _feed(h, value, tensor_bytes)
    elif isinstance(obj, (list, tuple)):
        h.update((b"L" if isinstance(obj, list) else b"U") + struct.pack("<Q", len(obj)))
        for value in obj:
            _feed(h, value, tensor_bytes)
    elif isinstance(obj, (set, frozenset)):
        # A set's iteration order can differ once it is loaded again: hash its elements' digests, sorted.
        parts = sorted(content_digest(item, tensor_bytes)["sha256"] for item in obj)
        h.update(b"E" + struct.pack("<Q", len(parts)) + "".join(parts).encode())
    elif obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        # repr round-trips floats exactly; the type keeps 1, 1.0 and True apart.
        text = f"{type(obj).__name__}:{obj!r}".encode()
        h.update(b"S" + struct.pack("<Q", len(text)) + text)
    else:
        # Other values a checkpoint may hold (torch.dtype, torch.device, ...) have a stable repr; one with an
        # address in it would never verify after loading, so refuse it now, at save time.
        text = f"{type(obj).__module__}.{type(obj).__qualname__}:{obj!r}"
        if re.search(r" at 0x[0-9a-fA-F]+", text):
            raise UserError(f"cannot checksum a {type(obj).__qualname__} in a checkpoint (its repr is {obj!r}): store "
                            "plain numbers, strings, lists, dicts or tensors (e.g. its state_dict())")
        h.update(b"O" + struct.pack("<Q", len(text)) + text.encode())
