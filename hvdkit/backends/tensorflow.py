"""The TensorFlow backend: ``horovod.tensorflow`` collectives, GPU pinning and seeds (Keras 3 on TF, tf-keras).

Example::

    backend = TensorFlowBackend()
    backend.allreduce_floats([loss, accuracy], "average", name="hvdkit.metrics.0")
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from hvdkit.backends import import_horovod
from hvdkit.runtime import cuda_driver
from hvdkit.runtime.backend import Backend
from hvdkit.runtime.topology import GPUView, pin_gpu

hvd = import_horovod("horovod.tensorflow", "hvdkit.keras")


class TensorFlowBackend(Backend):
    name = "tensorflow"
    framework = "TensorFlow"
    hvd = hvd

    def has_gpu(self) -> bool:
        return bool(tf.config.list_physical_devices("GPU"))

    def cuda_build(self) -> str | None:
        info = tf.sysconfig.get_build_info()
        return info.get("cuda_version") if info.get("is_cuda_build") else None

    def pin(self, rank: int, local_rank: int, local_size: int, use_gpu: bool = True):
        gpus = tf.config.list_physical_devices("GPU")
        if gpus and not use_gpu:
            tf.config.set_visible_devices([], "GPU")           # HVDKIT_DEVICE=cpu: TensorFlow places nothing there
            gpus = []
        view = GPUView.here(rank, local_rank, local_size, _gpu_uuids(len(gpus)) if gpus else (), use_gpu)

        def pin(index: int) -> None:
            tf.config.experimental.set_memory_growth(gpus[index], True)
            tf.config.set_visible_devices(gpus[index], "GPU")

        def gather(obj):
            # On the CPU: NCCL would stop at two ranks on one GPU before the check could name them.
            with tf.device("/CPU:0"):
                return self.allgather_object(obj, name="hvdkit.gpus")

        # Pin first: Horovod's TensorFlow collectives start TensorFlow's runtime, which fixes the visible GPUs.
        gpu = pin_gpu(view, gather, pin, pin_first=True)
        return gpu, "/CPU:0" if gpu is None else "/GPU:0"     # the only GPU TensorFlow now sees

    def set_threads(self, threads: int) -> bool:
        if tf.config.threading.get_intra_op_parallelism_threads() != threads:
            # Settable only before TensorFlow's runtime starts; the caller may already have used TF.
            try:
                tf.config.threading.set_intra_op_parallelism_threads(threads)
            except RuntimeError:
                return False
        return True

    def seed(self, value: int) -> None:
        tf.random.set_seed(value)

    def allreduce_floats(self, values: Sequence[float], op: str, name: str) -> list[float]:
        tensor = tf.constant(list(values), dtype=tf.float64)
        return hvd.allreduce(tensor, op=self.reduce_op(op), name=name).numpy().tolist()

    def broadcast_tensors(self, named: Sequence[tuple[str, tf.Tensor]], root_rank: int) -> list[tf.Tensor]:
        return [hvd.broadcast(t, root_rank, name=f"hvdkit.bcast.{n}") for n, t in named]

    def allreduce(self, tensor, op: str, name: str | None = None):
        return hvd.allreduce(tensor, op=self.reduce_op(op), name=name)

    def grouped_allreduce(self, tensors: Sequence[tf.Tensor], op: str, compression: str = "none") -> list:
        kwargs = {"op": self.reduce_op(op), "compression": self.compression(compression)}
        if op == "adasum":
            # Horovod 0.28.1's grouped_allreduce reads an unset name on its Adasum path
            # ("UnboundLocalError: ... 'tensor'"); its allreduce does not.
            return [hvd.allreduce(t, **kwargs) for t in tensors]
        return hvd.grouped_allreduce(list(tensors), **kwargs)

    def grouped_allgather(self, tensors: Sequence[tf.Tensor], name: str) -> list[tf.Tensor]:
        return hvd.grouped_allgather(list(tensors), name=name) if tensors else []

    def gather_to(self, root: int, tensors: Sequence[tf.Tensor], name: str) -> list[tf.Tensor]:
        out = []
        for n, piece in enumerate(tensors):
            splits = [0] * hvd.size()
            splits[root] = int(tf.size(piece))
            received = hvd.alltoall(piece, splits=splits, name=f"{name}.{n}")[0]
            if hvd.rank() == root:
                out.append(received)
        return out

    def collective_failure(self, exc: BaseException) -> bool:
        # Horovod's TensorFlow decorator only recognises failures of its plain allreduce/allgather/
        # broadcast ops; hvdkit's Keras optimizer uses the grouped allreduce, whose failure
        # TensorFlow raises as its own error type naming Horovod.
        return type(exc).__module__.startswith("tensorflow") and "Horovod" in str(exc)


def _gpu_uuids(count: int) -> list[str | None]:
    """The UUIDs of TensorFlow's ``GPU:0..count-1``, from the CUDA driver library (TensorFlow has no UUID API).

    None for each where the library cannot say or counts differently from
    TensorFlow; :attr:`hvdkit.runtime.topology.GPUView.gpus` then falls back to
    the CUDA_VISIBLE_DEVICES entries.
    """
    uuids = cuda_driver.visible_gpu_uuids()
    return uuids if uuids is not None and len(uuids) == count else [None] * count
