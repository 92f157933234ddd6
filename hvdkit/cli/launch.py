"""`hvdkit launch`: validate, print the exact horovodrun command, run it, and name the rank that failed.

    hvdkit launch -np 4 -H hosta:2,hostb:2 -p 12345 -- python examples/pytorch_mnist.py
    hvdkit launch -np 2 -H localhost:2 --gloo --dry-run -- python train.py   # print only
    hvdkit launch -np 2 -H localhost:2 --timeline tl.json -- python train.py  # then: hvdkit timeline tl.json
    hvdkit launch -np 4 --min-np 2 --max-np 8 --host-discovery-script examples/discover_hosts.sh \
        -- python examples/pytorch_elastic.py                                   # elastic
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from hvdkit.argtypes import positive_int
from hvdkit.cli.args import (
    add_host_arguments,
    add_np_argument,
    add_ssh_arguments,
    resolve_hosts,
    target_from_args,
)
from hvdkit.common.errors import UserError
from hvdkit.common.launcher import SLURM
from hvdkit.common.tuning import check_horovod_environment
from hvdkit.ops.launch import (
    BuildFlags,
    LaunchConfig,
    check_command,
    check_program,
    check_timeline,
    one_host_elastic_risk,
    plan_launch,
)
from hvdkit.ops.remote import discover_hosts, quick_check
from hvdkit.ops.supervise import supervise


@dataclass(frozen=True)
class LaunchCommandConfig:
    launch: LaunchConfig
    dry_run: bool = False
    check_hosts: bool = True            # ssh and hvdkit version on every host first
    hosts_chosen: str | None = None     # the hosts hvdkit picked when none were given, for the plan line

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LaunchCommandConfig:
        cmd = tuple(args.train_command[1:] if args.train_command[:1] == ["--"] else args.train_command)
        check_command(cmd)
        check_horovod_environment()
        if args.host_discovery_script:
            if args.np is None:
                raise UserError("-np is required with --host-discovery-script (the processes to start with)")
            hosts, np, chosen = discover_hosts(args.host_discovery_script, args.slots), args.np, None
        else:
            if args.slots is not None:
                raise UserError("--slots is for hosts a --host-discovery-script prints without ':N'; with -H, "
                                "--hostfile or --slurm the slots are in the host list")
            hosts, np, chosen = resolve_hosts(args, args.np)     # the rule doctor, bench and hosts follow too
            if args.np is None and chosen is None and hosts.source != "slurm":
                chosen = f"-np {np}: every slot listed, as mpirun does; give -np to start fewer"
        check_program(cmd, hosts)
        target = target_from_args(args, np, hosts)
        timeline = os.path.abspath(args.timeline) if args.timeline else None
        if timeline:
            check_timeline(timeline, hosts)
        launch = target.launch_config(cmd, args.controller, min_np=args.min_np, max_np=args.max_np,
                                      discovery_script=args.host_discovery_script,
                                      elastic_timeout=args.elastic_timeout, reset_limit=args.reset_limit,
                                      slots=args.slots, timeline=timeline)
        return cls(launch=launch, dry_run=args.dry_run, check_hosts=not args.no_check, hosts_chosen=chosen)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("launch", help="validate, print and run the horovodrun command for a job",
                            description="Plan a horovodrun command (MPI on one host or with NCCL, Gloo across "
                                        "CPU hosts), check the hosts answer over ssh with this hvdkit version, "
                                        "print the command, run it.")
    add_np_argument(parser, type=positive_int, help="number of processes (elastic: to start with; default: every "
                                                    f"slot of -H/--hostfile, or ${SLURM.NTASKS} in an allocation)")
    add_host_arguments(parser, discovery=True)
    elastic = parser.add_argument_group(
        "elastic", "--host-discovery-script or any of these makes the job elastic (on Gloo)")
    elastic.add_argument("--min-np", type=positive_int, help="keep training while at least this many remain "
                                                               "(default: -np)")
    elastic.add_argument("--max-np", type=positive_int, help="grow to at most this many")
    elastic.add_argument("--elastic-timeout", type=positive_int, metavar="SECONDS",
                         help="how long to wait for enough slots (horovodrun's default: 600)")
    elastic.add_argument("--reset-limit", type=positive_int, metavar="N",
                         help="end the job after N resizes (default: no limit)")
    elastic.add_argument("--slots", type=positive_int, metavar="N",
                         help="slots of a discovered host printed without ':N' (the MPI Operator's "
                              "/etc/mpi/discover_hosts.sh prints bare names)")
    add_ssh_arguments(parser)
    controller = parser.add_mutually_exclusive_group()
    controller.add_argument("--gloo", dest="controller", action="store_const", const="gloo", help="use Gloo")
    controller.add_argument("--mpi", dest="controller", action="store_const", const="mpi", help="use MPI")
    parser.add_argument("--timeline", metavar="FILE",
                        help="record Horovod's timeline here (rank 0 writes it on its host; read it with "
                             "hvdkit timeline FILE); turns Horovod's response cache off so each step's "
                             "per-rank times are recorded")
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    parser.add_argument("--no-check", action="store_true", help="skip the ssh and hvdkit version check")
    parser.add_argument("train_command", nargs=argparse.REMAINDER, help="-- python train.py ...")
    parser.set_defaults(config=LaunchCommandConfig.from_args, run=run, controller="auto")
    return parser


def run(config: LaunchCommandConfig) -> int:
    cfg = config.launch
    plan = plan_launch(cfg, BuildFlags.detect())
    if config.check_hosts and not config.dry_run:
        quick_check(cfg.hosts.names, cfg.ssh_port, cfg.ssh_identity_file)
    print(f"hvdkit launch: {plan.shell()}\n  ({plan.controller}: {plan.reason})", flush=True)
    if config.hosts_chosen:
        print(f"  (hosts: {config.hosts_chosen})", flush=True)
    risk = _warn(cfg)
    if config.dry_run:
        return 0
    return supervise(plan.argv, plan.layout, elastic=cfg.elastic, elastic_risk=risk)


def _warn(cfg: LaunchConfig) -> str | None:
    """What the job will do that the user may not expect: wait for slots, or end on one failure (returned)."""
    script, hosts = cfg.discovery_script, cfg.hosts
    if script and hosts.total_slots < cfg.np:
        wait = f"{cfg.elastic_timeout} s" if cfg.elastic_timeout else "--elastic-timeout (600 s by default)"
        print(f"hvdkit launch: warning: {script} lists {hosts.total_slots} slots, fewer than -np {cfg.np}; "
              f"horovodrun waits for more, for up to {wait}", file=sys.stderr, flush=True)
    risk = one_host_elastic_risk(hosts) if cfg.elastic else None
    if risk:
        print(f"hvdkit launch: warning: {risk}", file=sys.stderr, flush=True)
    return risk
