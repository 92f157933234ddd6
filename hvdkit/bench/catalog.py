"""What the benchmarks can run: implementation and model names, and each implementation's controller.

One list each, read by the workers (argparse choices), the runner (how to
launch) and the CLI (defaults and --help), without importing torch.
"""

ALLREDUCE_IMPLS = ("hvdkit", "horovod-mpi", "horovod-gloo", "torch", "mpi4py", "mpi4py-avg")
TRAIN_IMPLS = ("hvdkit", "horovod", "ddp")
MODELS = ("mnist", "resnet50")

# Which controller each implementation's processes are launched with. hvdkit
# gets "auto", i.e. whatever `hvdkit launch` would pick; so does "horovod-auto",
# which stands for plain horovodrun (it too prefers MPI when it is there).
CONTROLLER = {"hvdkit": "auto", "horovod-auto": "auto", "horovod-mpi": "mpi", "horovod-gloo": "gloo",
              "torch": "gloo", "mpi4py": "mpi", "mpi4py-avg": "mpi"}
