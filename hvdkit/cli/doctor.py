"""`hvdkit doctor`: pre-flight checks for a multi-host launch, one row per host and check.

    hvdkit doctor -H server1:4,server2:4 -p 12345
    hvdkit doctor --hostfile hostfiles/cluster-4x4 --network-interface eth0 --json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from hvdkit.cli.args import add_host_arguments, add_np_argument, add_ssh_arguments, resolve_hosts, target_from_args
from hvdkit.ops.doctor import DoctorConfig, render, run_doctor


@dataclass(frozen=True)
class DoctorCommandConfig:
    doctor: DoctorConfig
    json: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DoctorCommandConfig:
        hosts, np, _ = resolve_hosts(args, args.np)        # as launch resolves them: the job launch would run
        doctor = DoctorConfig(target_from_args(args, np, hosts), allreduce=not args.no_allreduce,
                              controller=args.controller)
        return cls(doctor=doctor, json=args.json)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("doctor", help="check ssh, versions, slots, network and a cross-host allreduce",
                            description="Pre-flight checks before a multi-host horovodrun; exit 1 on any failure.")
    add_np_argument(parser, "processes, as for launch (default: every slot listed, or the Slurm allocation's "
                            "tasks); with no hosts given, this many on this machine")
    add_host_arguments(parser)
    add_ssh_arguments(parser)
    parser.add_argument("--no-allreduce", action="store_true", help="skip the cross-host allreduce")
    controller = parser.add_mutually_exclusive_group()
    controller.add_argument("--mpi", dest="controller", action="store_const", const="mpi", default="auto",
                            help="check the job over MPI, as hvdkit launch --mpi runs it")
    controller.add_argument("--gloo", dest="controller", action="store_const", const="gloo",
                            help="check the job over Gloo, as hvdkit launch --gloo runs it")
    parser.add_argument("--json", action="store_true", help="the checks as JSON")
    parser.set_defaults(config=DoctorCommandConfig.from_args, run=run)
    return parser


def run(config: DoctorCommandConfig) -> int:
    report = run_doctor(config.doctor)
    print(json.dumps(report.to_dict(), indent=2) if config.json else render(report))
    return 0 if report.ok else 1
