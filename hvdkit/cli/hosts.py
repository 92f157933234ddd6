"""`hvdkit hosts`: validate and convert host lists, and show where each rank runs.

    hvdkit hosts -H server1:4,server2:4 -np 6       # rank -> host/local_rank table
    hvdkit hosts --hostfile hostfiles/cluster-4x4 --to hosts      # server1:4,server2:4,...
    hvdkit hosts -H a:2,b:2 --to hostfile > myhosts                # bare Horovod hostfile
    hvdkit hosts --hostfile hostfiles/elastic --to discovery       # host:slots lines, for elastic jobs
    hvdkit hosts --slurm --to hosts                                # inside sbatch/salloc: gpu01:4,gpu02:4
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping

from hvdkit.core import slurm
from hvdkit.core.errors import UserError
from hvdkit.core.hosts import HostSpec, parse_hostfile, parse_hosts_string, rank_layout, to_hostfile, to_hosts_string


def add_host_arguments(parser: argparse.ArgumentParser, discovery: bool = False) -> None:
    """-H / --hostfile / --slurm (/ --host-discovery-script), as horovodrun spells them (hosts, doctor, launch).

    None given inside a Slurm allocation means --slurm (see :func:`spec_from_args`).
    """
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-H", "--hosts", dest="hosts", help="host1:slots,host2:slots")
    group.add_argument("--hostfile", help="file with one '<host> slots=<N>' a line")
    group.add_argument("--slurm", action="store_true",
                       help="the hosts of this Slurm allocation ($SLURM_JOB_NODELIST, $SLURM_TASKS_PER_NODE); "
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


def spec_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> HostSpec:
    env = os.environ if env is None else env
    if args.hostfile:
        return parse_hostfile(args.hostfile)
    if args.hosts:
        return parse_hosts_string(args.hosts)
    if getattr(args, "slurm", False) or slurm.in_allocation(env):
        return slurm.allocation(env).hosts
    raise UserError("no hosts given: pass -H host1:N,host2:N or --hostfile FILE (or run inside a Slurm allocation)")


def default_np(args: argparse.Namespace, spec: HostSpec, env: Mapping[str, str] | None = None) -> int:
    """-np when given; in a Slurm allocation SLURM_NTASKS; otherwise every slot."""
    env = os.environ if env is None else env
    if args.np is not None:
        return args.np
    if spec.source == "slurm":
        return slurm.allocation(env).ntasks
    return spec.total_slots


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("hosts", help="validate/convert -H strings and hostfiles, show the rank layout",
                            description="Validate and convert host lists; print where each rank runs.")
    add_host_arguments(parser)
    parser.add_argument("-np", "--num-proc", dest="np", type=int,
                        help="processes (default: all slots; in Slurm, $SLURM_NTASKS)")
    parser.add_argument("--to", choices=["table", "hosts", "hostfile", "discovery"], default="table",
                        help="output: rank table (default), a -H string, a bare hostfile, or the host:slots "
                             "lines of an elastic job's --host-discovery-script")
    parser.add_argument("--json", action="store_true", help="hosts and rank layout as JSON")
    parser.set_defaults(func=command)
    return parser


def command(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    if args.to == "discovery":
        # Read again by Horovod every second while an elastic job runs: no
        # rank table, just the hosts (a parse error exits 2 and Horovod keeps
        # the last good list).
        print("\n".join(f"{h.name}:{h.slots}" for h in spec.hosts))
        return 0
    np = default_np(args, spec)
    layout = rank_layout(spec, np)
    if args.json:
        print(json.dumps({"source": spec.source, "np": np, "total_slots": spec.total_slots,
                          "hosts": [{"name": h.name, "slots": h.slots} for h in spec.hosts],
                          "hosts_string": to_hosts_string(spec),
                          "ranks": [{"rank": p.rank, "host": p.host, "local_rank": p.local_rank} for p in layout]},
                         indent=2))
    elif args.to == "hosts":
        print(to_hosts_string(spec))
    elif args.to == "hostfile":
        print(to_hostfile(spec), end="")
    else:
        print(f"{len(spec.hosts)} host(s), {spec.total_slots} slots, np={np}  "
              f"(horovodrun -np {np} -H {to_hosts_string(spec)})")
        print(f"{'rank':>4}  {'host':<24} local_rank")
        for p in layout:
            print(f"{p.rank:>4}  {p.host:<24} {p.local_rank}")
    return 0
