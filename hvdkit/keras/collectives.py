"""Which backend serves each Keras mode, and what Keras adds on top: variables and grouped gradients.

Keras 3 on TensorFlow and tf-keras use :mod:`hvdkit.backends.tensorflow`;
Keras 3 on PyTorch uses :mod:`hvdkit.backends.torch`, the same backend as
:mod:`hvdkit.torch`. Everything else (topology, objects, float reductions)
is the backend's (:class:`hvdkit.runtime.backend.Backend`).

Example::

    backend = backend_for("torch")
    broadcast_variables(backend, named_variables(model), root_rank=0)
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from hvdkit.runtime.backend import Backend
from hvdkit.runtime.state import broadcast_state


@lru_cache(maxsize=None)
def backend_for(mode: str) -> Backend:
    """The backend for hvdkit's Keras ``mode`` (``"tensorflow"``, ``"torch"`` or ``"tf_keras"``)."""
    if mode == "torch":
        from hvdkit.backends.torch import TorchBackend

        return TorchBackend()
    from hvdkit.backends.tensorflow import TensorFlowBackend

    return TensorFlowBackend()


def variable_value(variable):
    """The backend tensor behind a Keras variable (detached on torch; sharing its storage)."""
    value = getattr(variable, "value", variable)
    if callable(value):                  # tf-keras variables are tf.Variables, whose .value is a method
        return variable
    return value.detach() if hasattr(value, "detach") else value


def variable_numpy(variable) -> np.ndarray:
    """A Keras variable's value as a numpy array (off the device)."""
    value = variable.numpy() if hasattr(variable, "numpy") else variable.value.detach().cpu().numpy()
    return np.asarray(value)


def broadcast_variables(backend: Backend, named: list[tuple[str, object]], root_rank: int,
                        what: str = "model") -> None:
    """Assign ``root_rank``'s value to each named Keras variable, after every rank's names and shapes agree."""
    values = broadcast_state(backend, [(n, variable_value(v)) for n, v in named], root_rank, what=what)
    for (_, variable), value in zip(named, values):
        variable.assign(value)


def allreduce_gradients(backend: Backend, grads: list, op: str, compression: str) -> list:
    """One grouped allreduce over the non-None gradients (Horovod fuses them into few buffers)."""
    index = [i for i, g in enumerate(grads) if g is not None]
    if not index:
        return list(grads)
    reduced = backend.grouped_allreduce([grads[i] for i in index], op, compression)
    out = list(grads)
    for i, r in zip(index, reduced):
        out[i] = r
    return out


def allreduce_sum(backend: Backend, tensor):
    """Differentiable sum over ranks: Horovod's gradient of an allreduce is the allreduce of the gradient."""
    return backend.allreduce(tensor, "sum")
