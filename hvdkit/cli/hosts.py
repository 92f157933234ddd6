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
from dataclasses import dataclass

from hvdkit.cli.args import add_host_arguments, add_np_argument, resolve_hosts
from hvdkit.common.launcher import SLURM
from hvdkit.ops.hosts import HostSpec, rank_layout, to_hostfile, to_hosts_string


@dataclass(frozen=True)
class HostsConfig:
    hosts: HostSpec
    np: int
    to: str = "table"        # table, hosts, hostfile or discovery
    json: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> HostsConfig:
        hosts, np, _ = resolve_hosts(args, args.np)        # as launch resolves them
        return cls(hosts=hosts, np=np, to=args.to, json=args.json)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("hosts", help="validate/convert -H strings and hostfiles, show the rank layout",
                            description="Validate and convert host lists; print where each rank runs.")
    add_host_arguments(parser)
    add_np_argument(parser, help=f"processes (default: all slots; in Slurm, ${SLURM.NTASKS})")
    parser.add_argument("--to", choices=["table", "hosts", "hostfile", "discovery"], default="table",
                        help="output: rank table (default), a -H string, a bare hostfile, or the host:slots "
                             "lines of an elastic job's --host-discovery-script")
    parser.add_argument("--json", action="store_true", help="hosts and rank layout as JSON")
    parser.set_defaults(config=HostsConfig.from_args, run=run)
    return parser


def run(config: HostsConfig) -> int:
    spec, np = config.hosts, config.np
    if config.to == "discovery":
        # Read again by Horovod every second while an elastic job runs: no
        # rank table, just the hosts (a parse error exits 2 and Horovod keeps
        # the last good list).
        print("\n".join(f"{h.name}:{h.slots}" for h in spec.hosts))
        return 0
    layout = rank_layout(spec, np)
    if config.json:
        print(json.dumps({"source": spec.source, "np": np, "total_slots": spec.total_slots,
                          "hosts": [{"name": h.name, "slots": h.slots} for h in spec.hosts],
                          "hosts_string": to_hosts_string(spec),
                          "ranks": [{"rank": p.rank, "host": p.host, "local_rank": p.local_rank} for p in layout]},
                         indent=2))
    elif config.to == "hosts":
        print(to_hosts_string(spec))
    elif config.to == "hostfile":
        print(to_hostfile(spec), end="")
    else:
        print(f"{len(spec.hosts)} host(s), {spec.total_slots} slots, np={np}  "
              f"(horovodrun -np {np} -H {to_hosts_string(spec)})")
        print(f"{'rank':>4}  {'host':<24} local_rank")
        for p in layout:
            print(f"{p.rank:>4}  {p.host:<24} {p.local_rank}")
    return 0
