"""The arguments several commands share, spelled as horovodrun spells them, and their typed values.

``hvdkit hosts``, ``doctor``, ``launch`` and ``bench`` all take the hosts
(-H / --hostfile / --slurm, and for launch --host-discovery-script); doctor,
launch and bench also take horovodrun's ssh and network options. Each command's
``from_args`` reads them here, once::

    add_host_arguments(parser)                        # in add_parser
    add_ssh_arguments(parser)
    hosts, np, chosen = resolve_hosts(args, args.np)  # in the command's Config.from_args
    target = target_from_args(args, np, hosts)        # a LaunchTarget
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from hvdkit.common.errors import UserError
from hvdkit.common.launcher import SLURM
from hvdkit.ops import slurm
from hvdkit.ops.hosts import MAX_SLOTS_PER_HOST, Host, HostSpec, parse_hostfile, parse_hosts_string, to_hosts_string

if TYPE_CHECKING:      # imported where a target is made: `hvdkit hosts` (a discovery script's every second) needs none
    from hvdkit.ops.launch import LaunchTarget


def add_host_arguments(parser: argparse.ArgumentParser, discovery: bool = False) -> None:
    """-H / --hostfile / --slurm (/ --host-discovery-script), as horovodrun spells them (hosts, doctor, launch, bench).

    None given inside a Slurm allocation means --slurm (see :func:`spec_from_args`).
    """
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-H", "--hosts", dest="hosts", help="host1:slots,host2:slots")
    group.add_argument("--hostfile", help="file with one '<host> slots=<N>' a line")
    group.add_argument("--slurm", action="store_true",
                       help=f"the hosts of this Slurm allocation (${SLURM.NODELIST}, ${SLURM.TASKS_PER_NODE}); "
                            "the default inside sbatch/salloc when no hosts are given")
    if discovery:
        group.add_argument("--host-discovery-script", metavar="SCRIPT",
                           help="elastic job: an executable that prints host:slots lines, rerun while the job "
                                "runs (e.g. examples/discover_hosts.sh)")


def add_ssh_arguments(parser: argparse.ArgumentParser) -> None:
    """horovodrun's ssh and network options (doctor, launch, bench)."""
    parser.add_argument("-p", "--ssh-port", type=int, help="ssh port on every host (horovodrun -p)")
    parser.add_argument("-i", "--ssh-identity-file", help="private key for ssh (horovodrun --ssh-identity-file)")
    parser.add_argument("--network-interface", help="interface for Horovod traffic, e.g. eth0")


def add_np_argument(parser: argparse.ArgumentParser, help: str, type=int, default=None) -> None:
    """-np / --num-proc, horovodrun's spelling; read into ``args.np``."""
    parser.add_argument("-np", "--num-proc", dest="np", type=type, default=default, help=help)


def hosts_given(args: argparse.Namespace) -> bool:
    """Whether -H, --hostfile or --slurm is on the command line (a Slurm allocation alone does not count)."""
    return bool(args.hosts or args.hostfile or args.slurm)


def spec_from_args(args: argparse.Namespace, allocation: slurm.SlurmAllocation | None,
                   local_slots: int | None = None) -> HostSpec:
    """The hosts -H or --hostfile name; else the Slurm ``allocation`` (read once by :func:`resolve_hosts`);
    else ``local_slots`` on this machine when given (launch passes -np, as ``horovodrun -np 2`` runs)."""
    if args.hostfile:
        return parse_hostfile(args.hostfile)
    if args.hosts:
        return parse_hosts_string(args.hosts)
    if allocation is not None:
        return allocation.hosts
    if local_slots is not None:
        if local_slots > MAX_SLOTS_PER_HOST:
            raise UserError(f"-np {local_slots} with no hosts given would start {local_slots} processes on this "
                            f"machine, more than the {MAX_SLOTS_PER_HOST} slots hvdkit allows a host: lower -np, "
                            "or list the hosts with -H host1:N,host2:N")
        return HostSpec((Host("localhost", local_slots),))
    raise UserError("no hosts given: pass -H host1:N,host2:N or --hostfile FILE (or run inside a Slurm allocation)")


def resolve_hosts(args: argparse.Namespace, np: int | None,
                  env: Mapping[str, str] | None = None) -> tuple[HostSpec, int, str | None]:
    """Where a command's ranks run: the one rule for ``launch``, ``doctor``, ``bench`` and ``hosts``.

    The hosts: -H, --hostfile or --slurm when given (what the user wrote wins
    over the environment, as horovodrun's -H does); else the Slurm allocation
    the command runs in; else ``np`` slots on this machine, as ``horovodrun
    -np 2`` runs. The processes: -np, else the allocation's tasks, else every
    slot listed. Returns (hosts, np, a note when hvdkit chose this machine).
    The allocation is read from the environment once, here, and only when it
    gives the hosts. Whether a host is this machine is
    :func:`hvdkit.ops.hosts.is_this_machine`'s answer everywhere (``localhost``,
    ``127.0.0.1``, or this machine's name).
    """
    env = os.environ if env is None else env
    in_job = slurm.in_allocation(env)
    named = hosts_given(args) or in_job
    if np is None and not named:
        raise UserError("-np is required (the number of processes) when no hosts are given: pass -np N to run N on "
                        "this machine, or -H host1:N,host2:N, --hostfile FILE, or run inside a Slurm allocation")
    from_slurm = not (args.hostfile or args.hosts) and (args.slurm or in_job)
    allocation = slurm.allocation(env) if from_slurm else None
    hosts = spec_from_args(args, allocation, local_slots=np)
    chosen = None if named else f"{to_hosts_string(hosts)}, this machine: no -H, --hostfile or Slurm allocation given"
    if np is None:
        np = allocation.ntasks if allocation is not None else hosts.total_slots
    return hosts, np, chosen


def target_from_args(args: argparse.Namespace, np: int, hosts: HostSpec | None) -> LaunchTarget:
    """``np`` processes on ``hosts``, reached with the ssh and network options on the command line."""
    from hvdkit.ops.launch import LaunchTarget

    return LaunchTarget(np=np, hosts=hosts, ssh_port=args.ssh_port, ssh_identity_file=args.ssh_identity_file,
                        network_interface=args.network_interface)
