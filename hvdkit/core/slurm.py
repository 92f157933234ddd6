"""Hosts from a Slurm allocation, read from its environment (no ``scontrol`` needed).

Inside ``sbatch``/``salloc`` Slurm sets ``SLURM_JOB_NODELIST`` (compressed:
``gpu[01-04,07],cpu9``) and ``SLURM_TASKS_PER_NODE`` (``4(x2),2``: 4 tasks on
each of the first two nodes, 2 on the third). Together they are a host list
with slots, in node order; ``SLURM_NTASKS`` is the default ``-np``.

Example::

    expand_nodelist("gpu[01-02,07],cpu9")       # ['gpu01', 'gpu02', 'gpu07', 'cpu9']
    expand_tasks_per_node("4(x2),2")            # [4, 4, 2]
    allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"})
    # SlurmAllocation(job_id='7', hosts=HostSpec(... n1:2, n2:2 ...), ntasks=4)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hvdkit.core.errors import UserError
from hvdkit.core.hosts import Host, HostSpec, check_slots, valid_hostname

# The Slurm variables hvdkit reads (documented in sbatch(1) "OUTPUT ENVIRONMENT VARIABLES").
JOB_ID = "SLURM_JOB_ID"
NODELIST = "SLURM_JOB_NODELIST"
TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
NTASKS = "SLURM_NTASKS"
# Set in every task that srun starts (not in the batch script itself).
STEP_ID = "SLURM_STEP_ID"
# Set where the job (sbatch, salloc) or the step (srun) was given GPUs on this node.
GPU_VARIABLES = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE")


class SlurmError(UserError, ValueError):
    """The Slurm environment is missing or malformed; the message names the variable and the fix."""


@dataclass(frozen=True)
class SlurmAllocation:
    job_id: str
    hosts: HostSpec
    ntasks: int


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets: 'a[1-2,4],b' -> ['a[1-2,4]', 'b']."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SlurmError(f"{NODELIST}={text!r}: unbalanced ']'")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise SlurmError(f"{NODELIST}={text!r}: unbalanced '['")
    parts.append(text[start:])
    return parts


def _expand_range(item: str, whole: str) -> list[str]:
    if re.fullmatch(r"\d+", item):
        return [item]
    m = re.fullmatch(r"(\d+)-(\d+)", item)
    if not m or int(m.group(2)) < int(m.group(1)):
        raise SlurmError(f"{NODELIST}={whole!r}: {item!r} is not a number or a low-high range")
    width = len(m.group(1))   # Slurm keeps leading zeros: gpu[01-04]
    return [str(n).zfill(width) for n in range(int(m.group(1)), int(m.group(2)) + 1)]


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list, expanded in order (brackets may appear more than once in a name)."""
    text = text.strip()
    if not text:
        raise SlurmError(f"{NODELIST} is empty: run inside an allocation (sbatch/salloc)")
    names: list[str] = []
    for part in _split_top_level(text):
        m = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\](.*)", part)
        if not m:
            if not valid_hostname(part):
                raise SlurmError(f"{NODELIST}={text!r}: {part!r} is not a host name")
            names.append(part)
            continue
        prefix, ranges, rest = m.groups()
        for item in ranges.split(","):
            for number in _expand_range(item, text):
                names.extend(expand_nodelist(prefix + number + rest) if "[" in rest else [prefix + number + rest])
    for name in names:
        if not valid_hostname(name):
            raise SlurmError(f"{NODELIST}={text!r}: {name!r} is not a host name")
    return names


def expand_tasks_per_node(text: str) -> list[int]:
    """``4(x2),2`` -> ``[4, 4, 2]``."""
    counts: list[int] = []
    for item in text.strip().split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not m or int(m.group(1)) == 0 or (m.group(2) is not None and int(m.group(2)) == 0):
            raise SlurmError(f"{TASKS_PER_NODE}={text!r}: {item!r} is not N or N(xM) with N, M >= 1")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def in_allocation(env: Mapping[str, str]) -> bool:
    return bool(env.get(JOB_ID))


def gave_no_gpu(env: Mapping[str, str]) -> bool:
    """True in a Slurm job that was given no GPU here: the node's GPUs are hidden on purpose, not broken.

    Its /dev/nvidia* files still exist (cgroups deny them rather than remove them).
    """
    return in_allocation(env) and not any(env.get(v) for v in GPU_VARIABLES) and "CUDA_VISIBLE_DEVICES" not in env


def allocation(env: Mapping[str, str]) -> SlurmAllocation:
    """The allocation's hosts (one slot per task Slurm placed there) and task count."""
    if not in_allocation(env):
        raise SlurmError(f"{JOB_ID} is not set: run inside a Slurm allocation (sbatch or salloc), "
                         "or pass -H/--hostfile instead of --slurm")
    for var in (NODELIST, TASKS_PER_NODE):
        if not env.get(var):
            raise SlurmError(f"{var} is not set although {JOB_ID}={env[JOB_ID]}: request tasks "
                             "(sbatch --ntasks-per-node=N or -n N), or pass -H/--hostfile")
    names = expand_nodelist(env[NODELIST])
    counts = expand_tasks_per_node(env[TASKS_PER_NODE])
    if len(names) != len(counts):
        raise SlurmError(f"{NODELIST}={env[NODELIST]!r} names {len(names)} node(s) but "
                         f"{TASKS_PER_NODE}={env[TASKS_PER_NODE]!r} gives {len(counts)}: these come from one "
                         "allocation; do not set them by hand")
    if len(set(names)) != len(names):
        raise SlurmError(f"{NODELIST}={env[NODELIST]!r} names a node twice")
    for name, count in zip(names, counts):
        check_slots(name, count, f"{TASKS_PER_NODE}={env[TASKS_PER_NODE]!r}")
    ntasks_text = env.get(NTASKS, "")
    ntasks = int(ntasks_text) if ntasks_text.isdigit() else sum(counts)
    return SlurmAllocation(job_id=env[JOB_ID], hosts=HostSpec(tuple(Host(n, c) for n, c in zip(names, counts)),
                                                              source="slurm"), ntasks=ntasks)


# Set by the launchers that give a process its rank: horovodrun (Gloo), mpirun, srun --mpi=pmix, srun --mpi=pmi2.
RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")


def check_direct_launch(env: Mapping[str, str], mpi_built: bool) -> None:
    """Before ``hvd.init()``: stop a task that ``srun`` started in a way Horovod cannot join, with the fix.

    Under ``srun`` without an MPI plugin (``--mpi=none``, a cluster's usual
    default) no launcher gives the task a rank, and Open MPI aborts in MPI_Init
    with a page of text; Gloo needs horovodrun's rendezvous server, which srun
    does not start. Measured with Debian's Slurm 22.05 and Open MPI 4.1.4:
    ``srun --mpi=pmix`` works, ``--mpi=pmi2`` and ``--mpi=none`` abort.
    """
    if not env.get(STEP_ID) or int(env.get(NTASKS, "1") or 1) < 2:
        return   # not an srun step of several tasks
    if env.get("HOROVOD_RANK") is not None:
        return   # horovodrun (or hvdkit launch) started this task
    if env.get("HOROVOD_CONTROLLER", "").lower() == "gloo" or not mpi_built:
        raise SlurmError("srun cannot start a Gloo job: Gloo needs horovodrun's rendezvous; run "
                         "`hvdkit launch --slurm -- python train.py` in the allocation instead (or srun --mpi=pmix "
                         "with an MPI build of Horovod)")
    if not any(env.get(v) is not None for v in RANK_VARIABLES):
        raise SlurmError(f"srun started {env.get(NTASKS)} tasks without an MPI plugin, so Horovod cannot learn "
                         "its rank: launch with `srun --mpi=pmix python train.py` (or set MpiDefault=pmix)")
