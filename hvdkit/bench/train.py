"""Training-step benchmark worker: one implementation per launch, results from rank 0.

Launched by ``hvdkit bench train`` as ``python -m hvdkit.bench.train --impl NAME``,
NAME one of this bench's implementations in :data:`hvdkit.bench.catalog.CATALOG`;
its framework picks the :class:`Job` below (hvdkit: the hvdkit.torch recipe;
horovod: the same model by hand, as Horovod's pytorch_mnist example; DDP under
torchrun; ps: a parameter server, :mod:`hvdkit.bench.ps`). All get the same
OMP_NUM_THREADS from the runner.

Every step is split into input wait (next batch), compute (forward and
backward), allreduce (the gradient communication left after backward) and
update (optimizer step). Horovod's allreduce, written by hand, is what
``optimizer.synchronize()`` waits for. hvdkit and DDP wait inside backward
(gradients are averaged when it returns), so their share is estimated:
backward with communication minus backward without it (DDP's ``no_sync()``;
for hvdkit a copy of the model that has no allreduce hooks), measured in extra
steps before the warm-up.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from hvdkit.bench.catalog import every_implementation, implementation
from hvdkit.bench.models import MODELS
from hvdkit.bench.results import emit, launcher_world, machine, pin_cuda


def dataset(model: str, samples: int, image_size: int) -> TensorDataset:
    """The examples' digits data for ``mnist``; seeded synthetic images for ``resnet50``."""
    if model == "mnist":
        from hvdkit.examples.datasets import load_dataset

        data = load_dataset("digits", "data/mnist", seed=0)
        return TensorDataset(torch.from_numpy(data.x_train).unsqueeze(1), torch.from_numpy(data.y_train))
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(samples, 3, image_size, image_size, generator=g),
                         torch.randint(0, 1000, (samples,), generator=g))


class Job(ABC):
    """What differs between the implementations: setup (model, optimizer, loader) and how gradients are averaged.

    ``horovod_optimizer``: gradients are averaged by a Horovod
    DistributedOptimizer (so Horovod tells the controller). ``averages_in_backward``:
    backward returns averaged gradients (hvdkit, DDP), so the allreduce's share
    is backward minus :meth:`local_backward`; otherwise (Horovod by hand) it is
    what ``synchronize()`` still waits for, timed on its own.
    """

    rank = size = 0
    device = torch.device("cpu")
    controller = ""
    horovod_optimizer = True
    averages_in_backward = True

    def __init__(self, args):
        self.args = args

    @abstractmethod
    def setup(self, model, data):
        """Initialise the library; return the (wrapped) model, optimizer and this rank's loader."""

    @abstractmethod
    def close(self) -> None:
        """Shut the library down on this rank."""

    @abstractmethod
    def local_backward(self, model, x, y) -> None:
        """Forward and backward with no communication, to time the compute alone."""

    @property
    def reports(self) -> bool:
        """Whether this process prints the results."""
        return self.rank == 0

    def wait_gradients(self, model, optimizer) -> None:
        """After backward, when gradients are not averaged inside it: average them (timed as the allreduce)."""
        optimizer.synchronize()

    def update(self, optimizer) -> None:
        optimizer.step()


class HvdkitJob(Job):
    def setup(self, model, data):
        import hvdkit.torch as hk

        ctx = hk.init(seed=0)
        self.rank, self.size, self.device, self.hvd = ctx.rank, ctx.size, ctx.device, hk.hvd
        model = model.to(ctx.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=hk.scale_lr(0.01), momentum=0.9)
        optimizer = hk.DistributedOptimizer(optimizer, model,
                                            compression=implementation("train", self.args.impl).compression)
        hk.broadcast_state(model, optimizer)
        # The copy's parameters are new tensors, so the optimizer's allreduce hooks are not on them.
        self.local_model = copy.deepcopy(model)
        loader = hk.distributed_loader(data, self.args.batch_size, shuffle=True, seed=0, drop_last=True)
        return model, optimizer, loader

    def close(self) -> None:
        """Nothing to do: Horovod shuts itself down when the process exits."""

    def local_backward(self, model, x, y) -> None:
        self.local_model.zero_grad(set_to_none=True)
        F.cross_entropy(self.local_model(x), y).backward()


class HorovodJob(HvdkitJob):
    """Written the way Horovod's examples/pytorch/pytorch_mnist.py is.

    Its allreduce is timed in ``synchronize()`` (``averages_in_backward`` False), so
    ``local_backward`` is never called for it.
    """

    averages_in_backward = False

    def update(self, optimizer) -> None:
        with optimizer.skip_synchronize():
            optimizer.step()

    def setup(self, model, data):
        import horovod.torch as hvd
        from torch.utils.data.distributed import DistributedSampler

        hvd.init()
        torch.manual_seed(0)
        gpu = pin_cuda(hvd.local_rank(), torch.cuda)
        if gpu is not None:
            self.device = torch.device("cuda", gpu)
        self.rank, self.size, self.hvd = hvd.rank(), hvd.size(), hvd
        model = model.to(self.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        sampler = DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=0,
                                     drop_last=True)
        return model, optimizer, DataLoader(data, batch_size=self.args.batch_size, sampler=sampler, drop_last=True)


class DdpJob(Job):
    horovod_optimizer = False

    def setup(self, model, data):
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data.distributed import DistributedSampler

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
        self.rank, self.size, self.controller = dist.get_rank(), dist.get_world_size(), backend
        gpu = pin_cuda(launcher_world()[2], torch.cuda)     # torchrun's LOCAL_RANK
        if gpu is not None:
            self.device = torch.device("cuda", gpu)
        torch.manual_seed(0)
        model = DistributedDataParallel(model.to(self.device))
        self.model = model
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * self.size, momentum=0.9)
        sampler = DistributedSampler(data, num_replicas=self.size, rank=self.rank, shuffle=True, seed=0, drop_last=True)
        return model, optimizer, DataLoader(data, batch_size=self.args.batch_size, sampler=sampler, drop_last=True)

    def close(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()

    def local_backward(self, model, x, y) -> None:
        with model.no_sync():       # no update follows, so the ranks stay equal
            F.cross_entropy(model(x), y).backward()


class ParameterServerJob(Job):
    """Workers send each step's gradients to a parameter server (the first process) and step on the average.

    The server trains nothing: :meth:`serve` answers one exchange per step.
    Its allreduce share is the round trip to the server, timed on its own.
    """

    horovod_optimizer = False
    averages_in_backward = False
    controller = "gloo"

    def setup(self, model, data):
        from torch.utils.data.distributed import DistributedSampler

        from hvdkit.bench.ps import ParameterServer

        self.ps = ParameterServer.from_launcher()
        self.rank, self.size = self.ps.rank, self.ps.workers
        self.params = [p for p in model.parameters() if p.requires_grad]
        # Every worker starts from the same weights (the seed), as after a broadcast.
        optimizer = torch.optim.SGD(self.params, lr=0.01 * self.size, momentum=0.9)
        if self.ps.is_server:
            return model, optimizer, None
        sampler = DistributedSampler(data, num_replicas=self.size, rank=self.rank - 1, shuffle=True, seed=0,
                                     drop_last=True)
        return model, optimizer, DataLoader(data, batch_size=self.args.batch_size, sampler=sampler, drop_last=True)

    @property
    def reports(self) -> bool:
        return self.rank == 1

    def serve(self, steps: int) -> None:
        grads = [torch.empty_like(p) for p in self.params]
        for _ in range(steps):
            self.ps.serve_once(grads)

    def wait_gradients(self, model, optimizer) -> None:
        self.ps.average([p.grad for p in self.params])

    def local_backward(self, model, x, y) -> None:
        """Never called: the server's round trip is timed on its own (``averages_in_backward`` False)."""
        F.cross_entropy(model(x), y).backward()

    def close(self) -> None:
        self.ps.close()


JOBS = {"hvdkit": HvdkitJob, "horovod": HorovodJob, "torch.distributed": DdpJob, "ps": ParameterServerJob}


def batches(loader):
    """Endless batches, a new epoch (and shuffle) whenever the loader runs out."""
    epoch = 0
    while True:
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def step_times(job: Job, model, optimizer, loader, steps: int, warmup: int) -> tuple[dict, float]:
    """Per-phase seconds of ``steps`` timed steps (after ``warmup``), and backward-without-sync seconds."""
    it = batches(loader)
    clock = time.perf_counter
    cuda = job.device.type == "cuda"
    phases = {"input": [], "compute": [], "allreduce": [], "update": [], "step": []}
    local_compute = []

    def sync_clock():
        if cuda:
            torch.cuda.synchronize()
        return clock()

    # Extra steps first, backward without communication, where the allreduce hides in backward.
    calibrate = max(steps // 3, 5) if job.averages_in_backward else 0
    for i in range(-calibrate, warmup + steps):
        t0 = sync_clock()
        x, y = next(it)
        x, y = x.to(job.device, non_blocking=True), y.to(job.device, non_blocking=True)
        t1 = sync_clock()
        optimizer.zero_grad()
        if i < 0:
            job.local_backward(model, x, y)
            local_compute.append(sync_clock() - t1)
            continue
        F.cross_entropy(model(x), y).backward()
        t2 = sync_clock()
        if not job.averages_in_backward:
            job.wait_gradients(model, optimizer)
        t3 = sync_clock()
        job.update(optimizer)
        t4 = sync_clock()
        if i >= warmup:
            for name, value in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
                phases[name].append(value)
    return phases, (statistics.median(local_compute) if local_compute else float("nan"))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="training-step benchmark worker (run by hvdkit bench train)")
    p.add_argument("--impl", required=True, choices=[i.name for i in every_implementation("train")])
    p.add_argument("--model", required=True, choices=sorted(MODELS))
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--image-size", type=int, default=64, help="resnet50 input side")
    args = p.parse_args(argv)
    job = JOBS[implementation("train", args.impl).framework](args)
    world = launcher_world()[1]
    torch.manual_seed(0)
    model = MODELS[args.model]()
    samples = (args.steps + args.warmup) * args.batch_size * world
    if isinstance(job, ParameterServerJob) and launcher_world()[0] == 0:
        model, _, _ = job.setup(model, None)
        job.serve(args.warmup + args.steps)
        job.close()
        return
    model, optimizer, loader = job.setup(model, dataset(args.model, samples, args.image_size))
    if job.horovod_optimizer:
        job.controller = "mpi" if job.hvd.mpi_enabled() and not job.hvd.gloo_enabled() else "gloo"
    model.train()
    phases, local_backward = step_times(job, model, optimizer, loader, args.steps, args.warmup)
    if job.reports:
        params = sum(p.numel() for p in model.parameters())
        emit({"impl": args.impl, "model": args.model, "np": job.size, "controller": job.controller,
              "batch_size": args.batch_size, "image_size": args.image_size if args.model == "resnet50" else None,
              "params": params,
              "grad_bytes": params * (4 if implementation("train", args.impl).compression == "none" else 2),
              "device": job.device.type, "machine": machine(),
              "phases_s": phases, "local_backward_s": local_backward,
              "threads": torch.get_num_threads()})
    job.close()


if __name__ == "__main__":
    main()
