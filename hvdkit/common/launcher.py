"""Which launcher started this process and what it told it: the one place hvdkit reads a launcher's variables.

Each launcher gives its processes their place in the job in variables of its
own. hvdkit reads them here only, one :class:`Launcher` per launcher (as
Lightning Fabric keeps one cluster environment per launcher), and every other
module asks :func:`detect` or the Slurm helpers below:

- ``horovodrun`` with Gloo (and ``hvdkit launch --gloo``): ``HOROVOD_RANK``, ...
- Open MPI's ``mpirun`` (``horovodrun --mpi``, ``hvdkit launch`` on one host):
  ``OMPI_COMM_WORLD_RANK``, ...; under the Kubeflow MPI Operator the same, in
  pods it marks with ``K_MPI_JOB_ROLE``;
- ``srun --mpi=pmix`` inside a Slurm job: ``PMIX_RANK`` and Slurm's task variables;
- MPICH or Intel MPI's ``mpiexec``, and MVAPICH's ``mpirun``;
- ``torchrun``: ``RANK``, ``WORLD_SIZE``. Horovod does not join its processes
  into one job, so ``hk.init()`` refuses it (:func:`check_joined`).

The Slurm allocation (``sbatch``/``salloc``) is read here too
(:func:`slurm_job`); turning it into hosts is :mod:`hvdkit.ops.slurm`'s work.

Example::

    detect({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    # Place(launcher='mpirun', rank=1, size=4, local_rank=1, local_size=2, nodes=None)
    spans_one_host()                            # False under horovodrun -np 4 -H a:2,b:2
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from hvdkit.common.errors import UserError

# What a rank that checkpointed on preemption exits with, and hvdkit launch after it: EX_TEMPFAIL (sysexits.h),
# "try again later". A batch script can requeue on it (examples/slurm/train_gpu.sbatch); a crash's differs.
REQUEUE_EXIT_CODE = 75


class LauncherError(UserError):
    """A launcher started processes in a way Horovod does not join into one job; the message says the fix."""


@dataclass(frozen=True)
class Launcher:
    """One launcher's variables for a process's rank, the job's size, and its place on its host."""

    name: str                       # short, for plans and reports
    description: str                # for messages
    rank: str
    size: str
    local_rank: str | None = None
    local_size: str | None = None
    marker: str | None = None       # a variable only this launcher sets, where its rank's name is generic

    def started(self, env: Mapping[str, str]) -> bool:
        return _int(env, self.rank) is not None and (self.marker is None or self.marker in env)


@dataclass(frozen=True)
class Place:
    """Where this process runs, as its launcher said. ``None`` where the launcher does not say."""

    launcher: str                   # a Launcher's name, or "none" for a process started alone
    rank: int
    size: int
    local_rank: int
    local_size: int | None
    nodes: int | None               # how many hosts the job spans, where the launcher says


class SLURM:
    """The names of Slurm's variables hvdkit reads (sbatch(1), "OUTPUT ENVIRONMENT VARIABLES")."""

    JOB_ID = "SLURM_JOB_ID"
    NODELIST = "SLURM_JOB_NODELIST"
    TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
    NTASKS = "SLURM_NTASKS"
    STEP_ID = "SLURM_STEP_ID"                  # in every task srun starts, not in the batch script itself
    STEP_NODES = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES")
    # Set where the job (sbatch, salloc) or the step (srun) was given GPUs on this node.
    GPUS = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE")


HOROVODRUN = Launcher("horovodrun", "horovodrun (Gloo)", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
                      "HOROVOD_LOCAL_SIZE")
OPEN_MPI = Launcher("mpirun", "Open MPI's mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
# The MPI Operator's launcher runs Open MPI's mpirun; the operator marks its pods (launcher, worker).
MPI_OPERATOR_ROLE = "K_MPI_JOB_ROLE"
MPI_OPERATOR = replace(OPEN_MPI, name="mpi-operator", description="the Kubeflow MPI Operator's mpirun")
SRUN = Launcher("srun", "srun --mpi=pmix", "PMIX_RANK", SLURM.NTASKS, "SLURM_LOCALID")
MPICH = Launcher("mpiexec", "an MPICH or Intel MPI mpiexec", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
                 "MPI_LOCALNRANKS")
MVAPICH = Launcher("mvapich", "MVAPICH's mpirun", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
                   "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE")
TORCHRUN = Launcher("torchrun", "torchrun (or another torch.distributed launcher)", "RANK", "WORLD_SIZE",
                    "LOCAL_RANK", "LOCAL_WORLD_SIZE", marker="LOCAL_WORLD_SIZE")
# The order detect() asks them, the launcher nearest the process first where one runs under another: torchrun's
# workers inside an srun task (PMIX_RANK inherited) are torchrun's; horovodrun --gloo sets HOROVOD_* only.
LAUNCHERS = (HOROVODRUN, OPEN_MPI, TORCHRUN, SRUN, MPICH, MVAPICH)

def started_by_horovodrun(env: Mapping[str, str]) -> bool:
    """A process horovodrun started as a rank, under Gloo or Open MPI (what ``hvdkit launch`` signals)."""
    return HOROVODRUN.started(env) or OPEN_MPI.started(env)


def _int(env: Mapping[str, str], name: str | None) -> int | None:
    text = env.get(name, "").strip() if name else ""
    return int(text) if text.isdigit() else None


def launcher(env: Mapping[str, str] = os.environ) -> Launcher | None:
    """The launcher that started this process, or None for a process started alone."""
    for candidate in LAUNCHERS:
        if candidate.started(env):
            if candidate is OPEN_MPI and env.get(MPI_OPERATOR_ROLE):
                return MPI_OPERATOR
            return candidate
    return None


def detect(env: Mapping[str, str] = os.environ) -> Place:
    """This process's place in its job, from its launcher's variables (rank 0 of 1 when started alone)."""
    found = launcher(env)
    nodes = None
    if env.get(SLURM.STEP_ID) is not None:                  # a task of an srun step: the step's node count
        nodes = next((n for n in (_int(env, v) for v in SLURM.STEP_NODES) if n is not None), None)
    if found is None:
        return Place("none", 0, 1, 0, None, nodes)
    return Place(found.name, _int(env, found.rank), _int(env, found.size) or 1, _int(env, found.local_rank) or 0,
                 _int(env, found.local_size), nodes)


def spans_one_host(env: Mapping[str, str] = os.environ) -> bool:
    """Whether every rank runs on this host, from the launcher's variables (a lone process does)."""
    place = detect(env)
    if place.local_size is not None:
        return place.size == place.local_size
    if place.nodes is not None:
        return place.nodes == 1
    return True


def check_joined(env: Mapping[str, str], size: int, script: str = "train.py") -> None:
    """After ``hvd.init()``: raise :class:`LauncherError` if a launcher started N > 1 processes but Horovod sees one.

    torchrun (or an mpirun that Horovod was not built for) starts N copies
    that each become a one-process Horovod job: each trains alone and all
    write the same checkpoint. Only a size of 1 is flagged, so a variable
    inherited from an outer job (a PyTorchJob pod running horovodrun) does
    not stop a real multi-process Horovod job.
    """
    if size != 1:
        return
    for candidate in (TORCHRUN, OPEN_MPI, MPICH, MVAPICH):
        n = _int(env, candidate.size)
        if n is not None and n > 1:
            raise LauncherError(
                f"{candidate.size}={n}: {candidate.description} started {n} processes, but Horovod sees only this "
                f"one (hvd.size() is 1), so each would train alone and write the same checkpoint; launch with "
                f"`horovodrun -np {n} python {script}` or `hvdkit launch -np {n} -- python {script}` instead")


def check_srun_step(env: Mapping[str, str], mpi_built: bool) -> None:
    """Before ``hvd.init()``: stop a task that ``srun`` started in a way Horovod cannot join, with the fix.

    Under ``srun`` without an MPI plugin (``--mpi=none``, a cluster's usual
    default) no launcher gives the task a rank, and Open MPI aborts in MPI_Init
    with a page of text; Gloo needs horovodrun's rendezvous server, which srun
    does not start. Measured with Debian's Slurm 22.05 and Open MPI 4.1.4:
    ``srun --mpi=pmix`` works, ``--mpi=pmi2`` and ``--mpi=none`` abort.
    """
    ntasks = _int(env, SLURM.NTASKS) or 1
    if not env.get(SLURM.STEP_ID) or ntasks < 2:
        return   # not an srun step of several tasks
    if HOROVODRUN.started(env):
        return   # horovodrun (or hvdkit launch) started this task
    if env.get("HOROVOD_CONTROLLER", "").lower() == "gloo" or not mpi_built:
        raise LauncherError("srun cannot start a Gloo job: Gloo needs horovodrun's rendezvous; run "
                            "`hvdkit launch --slurm -- python train.py` in the allocation instead (or srun "
                            "--mpi=pmix with an MPI build of Horovod)")
    if not any(c.started(env) for c in (OPEN_MPI, SRUN, MPICH)):
        raise LauncherError(f"srun started {ntasks} tasks without an MPI plugin, so Horovod cannot learn its rank: "
                            "launch with `srun --mpi=pmix python train.py` (or set MpiDefault=pmix)")


@dataclass(frozen=True)
class SlurmJob:
    """The allocation's variables as Slurm set them (unparsed; :mod:`hvdkit.ops.slurm` expands them)."""

    job_id: str
    nodelist: str | None
    tasks_per_node: str | None
    ntasks: int | None
    gpus: str | None                # the first GPU variable set, as "NAME=value", or None


def slurm_job(env: Mapping[str, str] = os.environ) -> SlurmJob | None:
    """The Slurm allocation this process runs in (sbatch, salloc, srun), or None outside Slurm."""
    if not env.get(SLURM.JOB_ID):
        return None
    gpus = next((f"{v}={env[v]}" for v in SLURM.GPUS if env.get(v, "").strip() not in ("", "0")), None)
    return SlurmJob(env[SLURM.JOB_ID], env.get(SLURM.NODELIST) or None, env.get(SLURM.TASKS_PER_NODE) or None,
                    _int(env, SLURM.NTASKS), gpus)


def slurm_gave_no_gpu(env: Mapping[str, str] = os.environ) -> bool:
    """True in a Slurm job that was given no GPU here: the node's GPUs are hidden on purpose, not broken.

    Its /dev/nvidia* files still exist (cgroups deny them rather than remove them).
    """
    return bool(env.get(SLURM.JOB_ID)) and not any(env.get(v) for v in SLURM.GPUS) \
        and "CUDA_VISIBLE_DEVICES" not in env


# horovodrun starts each elastic worker as "sh -c 'env HOROVOD_HOSTNAME=h HOROVOD_RANK=r ... HOROVOD_LOCAL_RANK=l
# ... python train.py'" (through ssh for another host); the lookbehind keeps HOROVOD_CROSS_RANK out.
_SLOT_VALUE = {key: re.compile(rf"(?<!\w){key}=([\w.-]+)") for key in
               ("HOROVOD_HOSTNAME", HOROVODRUN.rank, HOROVODRUN.local_rank)}


def horovodrun_worker_slot(cmdline: str) -> tuple[int, str, int] | None:
    """(rank it started as, host, local rank) of the worker a horovodrun child process runs, from its command
    line; None for any other process::

        horovodrun_worker_slot("/bin/sh -c env HOROVOD_HOSTNAME=b HOROVOD_RANK=3 HOROVOD_LOCAL_RANK=1 python t.py")
        # (3, 'b', 1)
    """
    found = {key: pattern.search(cmdline) for key, pattern in _SLOT_VALUE.items()}
    if not all(found.values()) or not (found[HOROVODRUN.rank].group(1).isdigit()
                                       and found[HOROVODRUN.local_rank].group(1).isdigit()):
        return None
    return (int(found[HOROVODRUN.rank].group(1)), found["HOROVOD_HOSTNAME"].group(1),
            int(found[HOROVODRUN.local_rank].group(1)))
