"""Hosts from a Slurm allocation, read from its environment (no ``scontrol`` needed).

Inside ``sbatch``/``salloc`` Slurm sets the job's node list (compressed:
``gpu[01-04,07],cpu9``) and its tasks per node (``4(x2),2``: 4 tasks on
each of the first two nodes, 2 on the third); :func:`hvdkit.common.launcher.slurm_job`
reads them. Together they are a host list with slots, in node order; the
job's task count is the default ``-np``.

Example::

    expand_nodelist("gpu[01-02,07],cpu9")       # ['gpu01', 'gpu02', 'gpu07', 'cpu9']
    expand_tasks_per_node("4(x2),2")            # [4, 4, 2]
    allocation({JOB_ID: "7", NODELIST: "n[1-2]", TASKS_PER_NODE: "2(x2)"})
    # SlurmAllocation(job_id='7', hosts=HostSpec(... n1:2, n2:2 ...), ntasks=4)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hvdkit.common.errors import UserError
from hvdkit.common.launcher import SLURM, slurm_job
from hvdkit.ops.hosts import Host, HostSpec, check_slots, valid_hostname

JOB_ID, NODELIST, TASKS_PER_NODE = SLURM.JOB_ID, SLURM.NODELIST, SLURM.TASKS_PER_NODE


class SlurmError(UserError):
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
    return slurm_job(env) is not None


def allocation(env: Mapping[str, str]) -> SlurmAllocation:
    """The allocation's hosts (one slot per task Slurm placed there) and task count."""
    job = slurm_job(env)
    if job is None:
        raise SlurmError(f"{JOB_ID} is not set: run inside a Slurm allocation (sbatch or salloc), "
                         "or pass -H/--hostfile instead of --slurm")
    for var, value in ((NODELIST, job.nodelist), (TASKS_PER_NODE, job.tasks_per_node)):
        if not value:
            raise SlurmError(f"{var} is not set although {JOB_ID}={job.job_id}: request tasks "
                             "(sbatch --ntasks-per-node=N or -n N), or pass -H/--hostfile")
    names = expand_nodelist(job.nodelist)
    counts = expand_tasks_per_node(job.tasks_per_node)
    if len(names) != len(counts):
        raise SlurmError(f"{NODELIST}={job.nodelist!r} names {len(names)} node(s) but "
                         f"{TASKS_PER_NODE}={job.tasks_per_node!r} gives {len(counts)}: these come from one "
                         "allocation; do not set them by hand")
    if len(set(names)) != len(names):
        raise SlurmError(f"{NODELIST}={job.nodelist!r} names a node twice")
    for name, count in zip(names, counts):
        check_slots(name, count, f"{TASKS_PER_NODE}={job.tasks_per_node!r}")
    return SlurmAllocation(job_id=job.job_id, hosts=HostSpec(tuple(Host(n, c) for n, c in zip(names, counts)),
                                                             source="slurm"), ntasks=job.ntasks or sum(counts))
