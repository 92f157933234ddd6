"""Worker: one Horovod allreduce across the job's hosts; rank 0 prints a JSON line (size, hosts, sum)."""

import json
import socket

import horovod.torch as hvd
import torch

hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum, name="sum").item()
hosts = hvd.allgather_object(socket.gethostname(), name="hosts")
if hvd.rank() == 0:
    print(json.dumps({"size": hvd.size(), "hosts": sorted(set(hosts)), "sum": total}), flush=True)
