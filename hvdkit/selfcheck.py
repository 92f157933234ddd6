"""A tiny cross-host allreduce for `hvdkit doctor`: ``horovodrun ... python -m hvdkit.selfcheck``.

It uses whichever framework this Horovod was built with (torch first, else
TensorFlow), so the check works on a host that has only one of them. Every
rank prints one line ``hvdkit-selfcheck rank=R size=N host=H framework=F ok=True|False``.
"""

import socket


def _sum_of_ranks() -> tuple[float, int, int, str]:
    """(sum over ranks of rank+1, rank, size, framework used), through Horovod's allreduce."""
    try:
        import horovod.torch as hvd
        import torch

        hvd.init()
        value = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, name="hvdkit.selfcheck").item()
        framework = "torch"
    except ImportError:   # Horovod without its torch module: a TensorFlow/Keras host
        import horovod.tensorflow as hvd
        import tensorflow as tf

        hvd.init()
        value = float(hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum, name="hvdkit.selfcheck")[0])
        framework = "tensorflow"
    return value, hvd.rank(), hvd.size(), framework


if __name__ == "__main__":
    value, rank, size, framework = _sum_of_ranks()
    print(f"hvdkit-selfcheck rank={rank} size={size} host={socket.gethostname()} framework={framework} "
          f"ok={value == size * (size + 1) / 2}", flush=True)
