"""Step 4 for any framework: rank 0's named tensors (and one object) to every rank, names checked first.

Both adapters' ``broadcast_state`` and the Keras elastic ``sync`` come here.
Before anything is sent, the ranks compare the names, shapes and dtypes of
what they are about to receive: a rank that built a different model raises
one error on every rank instead of leaving the others waiting in a
broadcast that never pairs.

What differs between the adapters is only what they pass: torch sends the
model's ``state_dict`` tensors here and its optimizer state as one object
(the state of a torch optimizer that has not stepped yet is empty, and
Horovod's ``broadcast_optimizer_state`` fills it by running a zero-gradient
step, which moves Adam's counter); Keras sends model and optimizer
variables, all as tensors (its optimizer builds zero slots without a step).

Example::

    values = broadcast_state(backend, list(model.state_dict().items()), root_rank=0)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from hvdkit.core.backend import Backend
from hvdkit.core.errors import UserError


class StateMismatchError(UserError):
    """The ranks hold differently named or shaped state, so a broadcast could not pair."""


def signature(named: Sequence[tuple[str, Any]]) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of each tensor: what every rank must agree on before a broadcast."""
    return [(n, tuple(int(d) for d in t.shape), str(getattr(t.dtype, "name", t.dtype)).replace("torch.", ""))
            for n, t in named]


def check_same_state(backend: Backend, named: Sequence[tuple[str, Any]], what: str = "state") -> None:
    """Raise :class:`StateMismatchError` on every rank unless all ranks hold the same names, shapes and dtypes."""
    sig = signature(named)
    digest = hashlib.sha256(repr(sig).encode()).hexdigest()
    digests = backend.allgather_object(digest, name="hvdkit.state.digest")
    if len(set(digests)) == 1:
        return
    # Every rank saw the mismatch, so every rank takes this second gather.
    sigs = backend.allgather_object(sig, name="hvdkit.state.signature")
    other = next(r for r, d in enumerate(digests) if d != digests[0])
    raise StateMismatchError(f"rank {other}'s {what} differs from rank 0's ({_first_difference(sigs[0], sigs[other])}):"
                             " every rank must build the same model and optimizer before broadcast_state")


def _first_difference(a: list, b: list) -> str:
    names_a, names_b = {x[0]: x for x in a}, {x[0]: x for x in b}
    for name, entry in names_a.items():
        if name not in names_b:
            return f"{name!r} is missing there"
        if names_b[name] != entry:
            return f"{name!r} is {names_b[name][1]} {names_b[name][2]} there, {entry[1]} {entry[2]} on rank 0"
    extra = [n for n in names_b if n not in names_a]
    return f"{extra[0]!r} is only there" if extra else "the order differs"


def broadcast_state(backend: Backend, named: Sequence[tuple[str, Any]], root_rank: int = 0, *,
                    what: str = "state") -> list:
    """``root_rank``'s value of each named tensor, after :func:`check_same_state` (see the module)."""
    check_same_state(backend, named, what)
    return backend.broadcast_tensors([(f"{i}.{n}", t) for i, (n, t) in enumerate(named)], root_rank)
