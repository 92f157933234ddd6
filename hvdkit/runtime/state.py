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

import numpy as np

from hvdkit.common.errors import UserError
from hvdkit.runtime import topology
from hvdkit.runtime.backend import Backend


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


class RanksDivergedError(UserError):
    """The ranks' weights differ at the first step: they started from different weights."""


def weights_check_applies(size: int) -> bool:
    """Whether :func:`check_weights_agree` runs at the first step: on several ranks, and not in an elastic job.

    Under elastic Horovod (horovodrun sets HOROVOD_ELASTIC=1) a worker that
    joins later would wait alone in the gather at its first step, and the
    elastic state's sync already gives every rank rank 0's weights.
    """
    return size > 1 and not topology.is_elastic()


def weights_digest(arrays) -> tuple[float, float, float]:
    """(sum, sum of squares, sum of absolute values) of all ``arrays``, in float64: cheap to gather and compare."""
    total = np.zeros(3)
    for a in arrays:
        a = np.asarray(a, dtype=np.float64)
        total += (a.sum(), np.square(a).sum(), np.abs(a).sum())
    return tuple(float(x) for x in total)


def check_weights_agree(backend: Backend, digest: Sequence[float], fix: str, *, when: str = "after the first step",
                        rtol: float = 1e-6) -> None:
    """Raise :class:`RanksDivergedError` on every rank unless all ranks' weight digests agree with rank 0's.

    ``digest`` is this rank's (sum, sum of squares, sum of |w|) of the
    weights it trains (:func:`weights_digest`, or the same three numbers
    computed by the framework). Averaged gradients keep identical weights
    identical (up to float roundoff, hence ``rtol``), so a difference means
    the ranks started apart (built before seeding, seeded per rank, or
    loaded from different files) and nothing copied rank 0's weights. One small allgather, run once;
    every rank sees the same gathered digests, so all raise together.
    """
    digests = backend.allgather_object(tuple(float(x) for x in digest), name="hvdkit.state.weights_digest")
    total, squares, scale = digests[0]
    for rank, (t, s, _) in enumerate(digests[1:], start=1):
        if abs(t - total) > rtol * max(scale, 1e-30) or abs(s - squares) > rtol * max(squares, 1e-30):
            raise RanksDivergedError(
                f"rank {rank}'s weights differ from rank 0's {when} (sum of squares {s:.9g} there, "
                f"{squares:.9g} on rank 0): the ranks started from different weights; {fix}")
