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
import signal
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass

from hvdkit.cli.args import (
    add_host_arguments,
    add_np_argument,
    add_ssh_arguments,
    default_np,
    spec_from_args,
    target_from_args,
)
from hvdkit.core.argtypes import positive_int
from hvdkit.core.errors import UserError
from hvdkit.core.hosts import HostSpec, RankPlacement
from hvdkit.core.launch import (
    BuildFlags,
    LaunchConfig,
    check_command,
    explain_failure,
    one_host_elastic_risk,
    plan_launch,
)
from hvdkit.core.remote import discover_hosts, quick_check
from hvdkit.core.tuning import check_horovod_environment


@dataclass(frozen=True)
class LaunchCommandConfig:
    launch: LaunchConfig
    dry_run: bool = False
    check_hosts: bool = True            # ssh and hvdkit version on every host first

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LaunchCommandConfig:
        cmd = tuple(args.train_command[1:] if args.train_command[:1] == ["--"] else args.train_command)
        check_command(cmd)
        check_horovod_environment()
        hosts = _hosts(args)
        if args.np is None and hosts.source != "slurm":
            raise UserError("-np is required (the number of processes), except inside a Slurm allocation")
        target = target_from_args(args, default_np(args.np, hosts), hosts)
        launch = target.launch_config(cmd, args.controller, min_np=args.min_np, max_np=args.max_np,
                                      discovery_script=args.host_discovery_script,
                                      elastic_timeout=args.elastic_timeout, reset_limit=args.reset_limit,
                                      slots=args.slots,
                                      timeline=os.path.abspath(args.timeline) if args.timeline else None)
        return cls(launch=launch, dry_run=args.dry_run, check_hosts=not args.no_check)


def _hosts(args: argparse.Namespace) -> HostSpec:
    """The host list, or what the discovery script prints now (run once here, as horovodrun will run it)."""
    script = args.host_discovery_script
    if args.slots is not None and not script:
        raise UserError("--slots is for hosts a --host-discovery-script prints without ':N'; with -H, "
                        "--hostfile or --slurm the slots are in the host list")
    return discover_hosts(script, args.slots) if script else spec_from_args(args)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("launch", help="validate, print and run the horovodrun command for a job",
                            description="Plan a horovodrun command (MPI when Horovod has it, else Gloo), "
                                        "check the hosts answer over ssh with this hvdkit version, print the "
                                        "command, run it.")
    add_np_argument(parser, type=positive_int, help="number of processes (elastic: to start with; in a Slurm "
                                                    "allocation default $SLURM_NTASKS)")
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
    _warn(cfg)
    if config.dry_run:
        return 0
    return supervise(plan.argv, plan.layout)


def _warn(cfg: LaunchConfig) -> None:
    """What the job will do that the user may not expect: wait for slots, or end on one failure."""
    script, hosts = cfg.discovery_script, cfg.hosts
    if script and hosts.total_slots < cfg.np:
        wait = f"{cfg.elastic_timeout} s" if cfg.elastic_timeout else "--elastic-timeout (600 s by default)"
        print(f"hvdkit launch: warning: {script} lists {hosts.total_slots} slots, fewer than -np {cfg.np}; "
              f"horovodrun waits for more, for up to {wait}", file=sys.stderr, flush=True)
    risk = one_host_elastic_risk(hosts) if cfg.elastic else None
    if risk:
        print(f"hvdkit launch: warning: {risk}", file=sys.stderr, flush=True)


def supervise(argv: tuple[str, ...], layout: tuple[RankPlacement, ...]) -> int:
    """Run horovodrun, pass its output through, and on failure add one line: which rank, where, why.

    horovodrun runs in a process group of its own, and SIGINT, SIGTERM and
    SIGHUP sent to hvdkit (a Ctrl-C, or a supervisor signalling this process
    alone) go to that whole group once: with --mpi, horovodrun has exec'd
    ``sh -c mpirun ...``, and a signal to the shell alone left mpirun running.
    If hvdkit itself dies, even by SIGKILL, a small guard process sends the
    group SIGTERM. The exit code is horovodrun's (128 + N when a signal N ended it).
    """
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                            start_new_session=True)
    guard = _guard_group(proc.pid)
    tail: deque[str] = deque(maxlen=500)

    def pump(source, sink):
        for line in source:
            sink.write(line)
            sink.flush()
            tail.append(line)

    readers = [threading.Thread(target=pump, args=(proc.stdout, sys.stdout), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, sys.stderr), daemon=True)]
    for reader in readers:
        reader.start()
    def forward(number, _frame):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, number)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    rc = proc.wait()
    guard.stdin.close()          # the job is over: the guard has nothing left to stop
    for reader in readers:
        reader.join(timeout=5)
    if rc != 0:
        why = explain_failure("".join(tail), layout)
        print(f"hvdkit launch: job failed: {why or f'horovodrun exited with status {rc}'} "
              "(its own output is above)", file=sys.stderr, flush=True)
    return rc if rc >= 0 else 128 - rc


# Waits for EOF on stdin (this hvdkit process ended, however it ended), then sends SIGTERM to the job's
# process group. A pre-exec PR_SET_PDEATHSIG reaches only horovodrun's own process, which under --mpi is a
# shell whose mpirun then trained on (tests/multiproc/test_fail_fast.py).
_GUARD = """
import os, signal, sys
sys.stdin.buffer.read()
try:
    os.killpg(int(sys.argv[1]), signal.SIGTERM)
except ProcessLookupError:
    pass
"""


def _guard_group(pgid: int) -> subprocess.Popen:
    """A process that stops the job's process group ``pgid`` when hvdkit launch goes away."""
    return subprocess.Popen([sys.executable, "-c", _GUARD, str(pgid)], stdin=subprocess.PIPE,
                            start_new_session=True)
