"""A tiny cross-host allreduce for `hvdkit doctor`: ``horovodrun ... python -m hvdkit.torch.selfcheck``.

Every rank prints one line ``hvdkit-selfcheck rank=R size=N host=H ok=True|False``.
"""

import socket

import horovod.torch as hvd
import torch

hvd.init()
value = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, name="hvdkit.selfcheck").item()
expected = hvd.size() * (hvd.size() + 1) / 2
print(f"hvdkit-selfcheck rank={hvd.rank()} size={hvd.size()} host={socket.gethostname()} ok={value == expected}",
      flush=True)
