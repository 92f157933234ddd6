"""Horovod collectives for the tensors of the active Keras backend.

Keras 3 on TensorFlow and tf-keras use ``horovod.tensorflow``; Keras 3 on
PyTorch uses ``horovod.torch``. Both expose the same small surface, so the
optimizer, callbacks and checkpoints are written once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import lru_cache


def import_horovod(module: str):
    """``module`` of Horovod, or an ImportError that says how to build it."""
    try:
        return __import__(module, fromlist=["init"])
    except ImportError as exc:
        raise ImportError(f"hvdkit.keras needs {module} ({exc}): run scripts/install.sh (or `make install`), "
                          "which builds Horovod 0.28.1 with TensorFlow and PyTorch support") from exc


class Collectives(ABC):
    """allreduce/broadcast over the backend's tensors; ``hvd`` is the Horovod module in use."""

    def __init__(self, module: str):
        self.hvd = import_horovod(module)
        self.ops = {"average": self.hvd.Average, "sum": self.hvd.Sum, "adasum": self.hvd.Adasum}
        self.compressions = {"none": self.hvd.Compression.none, "fp16": self.hvd.Compression.fp16}

    def allreduce_gradients(self, grads: list, op: str, compression: str) -> list:
        """One grouped allreduce over the non-None gradients (Horovod fuses them into few buffers)."""
        index = [i for i, g in enumerate(grads) if g is not None]
        if not index:
            return list(grads)
        reduced = self.hvd.grouped_allreduce([grads[i] for i in index], op=self.ops[op],
                                             compression=self.compressions[compression])
        out = list(grads)
        for i, r in zip(index, reduced):
            out[i] = r
        return out

    def allreduce_sum(self, tensor):
        """Differentiable sum over ranks: Horovod's gradient of an allreduce is the allreduce of the gradient."""
        return self.hvd.allreduce(tensor, op=self.hvd.Sum)

    def broadcast_variables(self, variables: list, root_rank: int) -> None:
        for i, v in enumerate(variables):
            v.assign(self.hvd.broadcast(self._value(v), root_rank, name=f"hvdkit.bcast.{i}"))

    def broadcast_object(self, obj, root_rank: int, name: str):
        return self.hvd.broadcast_object(obj, root_rank=root_rank, name=name)

    def allgather_object(self, obj, name: str) -> list:
        return self.hvd.allgather_object(obj, name=name)

    @abstractmethod
    def _value(self, variable):
        """The backend tensor behind a Keras variable."""

    @abstractmethod
    def average_floats(self, values: list[float], name: str) -> list[float]:
        """The mean over ranks of a short list of Python floats."""


class TensorFlowCollectives(Collectives):
    def __init__(self):
        super().__init__("horovod.tensorflow")
        import tensorflow as tf

        self.tf = tf

    def _value(self, variable):
        # Keras 3 variables hold the tf.Variable in .value; tf-keras variables are tf.Variables
        # (whose .value is a method).
        value = getattr(variable, "value", variable)
        return self.tf.convert_to_tensor(variable if callable(value) else value)

    def average_floats(self, values: list[float], name: str) -> list[float]:
        t = self.tf.constant(values, dtype=self.tf.float64)
        return self.hvd.allreduce(t, op=self.hvd.Average, name=name).numpy().tolist()


class TorchCollectives(Collectives):
    def __init__(self):
        super().__init__("horovod.torch")
        import torch

        self.torch = torch

    def _value(self, variable):
        return variable.value.detach()

    def average_floats(self, values: list[float], name: str) -> list[float]:
        t = self.torch.tensor(values, dtype=self.torch.float64)
        return self.hvd.allreduce(t, op=self.hvd.Average, name=name).tolist()


@lru_cache(maxsize=None)
def for_mode(mode: str) -> Collectives:
    return TorchCollectives() if mode == "torch" else TensorFlowCollectives()
