"""`hvdkit launch`: validate, print the exact horovodrun command, run it, and name the rank that failed.

    hvdkit launch -np 4 -H hosta:2,hostb:2 -p 12345 -- python examples/pytorch_mnist.py
    hvdkit launch -np 2 -H localhost:2 --gloo --dry-run -- python train.py   # print only
    hvdkit launch -np 4 --min-np 2 --max-np 8 --host-discovery-script examples/discover_hosts.sh \
        -- python examples/pytorch_elastic.py                                   # elastic
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import hvdkit
from hvdkit.cli.doctor import add_ssh_arguments
from hvdkit.cli.hosts import add_host_arguments, default_np, spec_from_args
from hvdkit.core.argtypes import positive_int
from hvdkit.core.doctor import SSH_CONNECT_TIMEOUT_S, last_line, run_bounded, ssh_argv, ssh_fix_hint
from hvdkit.core.envreport import probe_horovod
from hvdkit.core.errors import UserError
from hvdkit.core.hosts import HostSpec, is_this_machine, parse_discovery_output, rank_layout
from hvdkit.core.launch import BuildFlags, LaunchConfig, check_command, explain_failure, plan_launch

DISCOVERY_TIMEOUT_S = 30


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("launch", help="validate, print and run the horovodrun command for a job",
                            description="Plan a horovodrun command (MPI when Horovod has it, else Gloo), "
                                        "check the hosts answer over ssh with this hvdkit version, print the command, run it.")
    parser.add_argument("-np", "--num-proc", dest="np", type=positive_int,
                        help="number of processes (elastic: to start with; in a Slurm allocation "
                             "default $SLURM_NTASKS)")
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
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    parser.add_argument("--no-check", action="store_true", help="skip the ssh and hvdkit version check")
    parser.add_argument("train_command", nargs=argparse.REMAINDER, help="-- python train.py ...")
    parser.set_defaults(func=command, controller="auto")
    return parser


def quick_check(hosts: list[str], port: int | None, identity: str | None, python: str = sys.executable) -> None:
    """Every remote host answers ssh and has this hvdkit version at the same path; raise naming the first that does not.

    The version matters: ranks built from different checkouts can disagree
    on defaults or on what they broadcast, and fail far from the cause.
    """
    remote = [h for h in hosts if not is_this_machine(h)]
    probe = f"{shlex.quote(python)} -c 'import hvdkit; print(hvdkit.__version__)'"
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(remote)))) as pool:
        results = list(pool.map(lambda h: run_bounded(ssh_argv(h, probe, port, identity), SSH_CONNECT_TIMEOUT_S + 10),
                                remote))
    for host, (rc, out, err) in zip(remote, results):
        last = last_line(err, rc)
        if rc in (124, 255) or (rc == 127 and last.startswith("[Errno")):   # ssh itself failed (or is missing)
            raise UserError(f"ssh to {host} failed ({last}): {ssh_fix_hint(host, err, port)}; "
                            "'hvdkit doctor' checks everything")
        if rc != 0:
            raise UserError(f"hvdkit is not importable at {python} on {host} ({last}): install it there with "
                            "scripts/install.sh at the same path (or use the same image)")
        version = out.strip()
        if version != hvdkit.__version__:
            raise UserError(f"{host} has hvdkit {version}, this machine {hvdkit.__version__}: run scripts/install.sh "
                            f"on {host} from the same checkout (or use the same image); 'hvdkit doctor' compares all versions")


def discover_hosts(script: str, default_slots: int | None = None) -> HostSpec:
    """Run an elastic job's discovery script once, as horovodrun will, and parse what it prints.

    horovodrun runs it again every second; a script that fails now would fail
    the job at start-up, after the workers' ssh set-up, with a less clear message.
    """
    if not os.path.isfile(script):
        raise UserError(f"discovery script {script!r} does not exist: check the path (e.g. examples/discover_hosts.sh)")
    if not os.access(script, os.X_OK):
        raise UserError(f"discovery script {script!r} is not executable: chmod +x {shlex.quote(script)}")
    rc, out, err = run_bounded([os.path.abspath(script)], DISCOVERY_TIMEOUT_S)
    if rc != 0:
        last = last_line(err, rc)
        raise UserError(f"discovery script {script} failed ({last}): run it by hand and fix it; "
                        "it must print host:slots lines and exit 0")
    return parse_discovery_output(out, script, default_slots)


def command(args: argparse.Namespace) -> int:
    cmd = tuple(args.train_command[1:] if args.train_command[:1] == ["--"] else args.train_command)
    check_command(cmd)
    build, error = probe_horovod()
    if build is None:
        raise UserError(f"Horovod is not usable here ({error}): run scripts/install.sh")
    launcher = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    script = args.host_discovery_script
    if args.slots is not None and not script:
        raise UserError("--slots is for hosts a --host-discovery-script prints without ':N'; with -H, "
                        "--hostfile or --slurm the slots are in the host list")
    hosts = discover_hosts(script, args.slots) if script else spec_from_args(args)
    if args.np is None and hosts.source != "slurm":
        raise UserError("-np is required (the number of processes), except inside a Slurm allocation")
    np = default_np(args, hosts)
    cfg = LaunchConfig(np=np, hosts=hosts, command=cmd, controller=args.controller,
                       ssh_port=args.ssh_port, ssh_identity_file=args.ssh_identity_file,
                       network_interface=args.network_interface,
                       horovodrun=launcher if os.path.exists(launcher) else "horovodrun",
                       min_np=args.min_np, max_np=args.max_np, discovery_script=script,
                       elastic_timeout=args.elastic_timeout, reset_limit=args.reset_limit, slots=args.slots)
    plan = plan_launch(cfg, BuildFlags(mpi=build.controllers["mpi"], gloo=build.controllers["gloo"]))
    if not args.no_check and not args.dry_run:
        quick_check(hosts.names, args.ssh_port, args.ssh_identity_file)
    print(f"hvdkit launch: {plan.shell()}\n  ({plan.controller}: {plan.reason})", flush=True)
    if script and hosts.total_slots < np:
        wait = f"{args.elastic_timeout} s" if args.elastic_timeout else "--elastic-timeout (600 s by default)"
        print(f"hvdkit launch: warning: {script} lists {hosts.total_slots} slots, fewer than -np {np}; "
              f"horovodrun waits for more, for up to {wait}", file=sys.stderr, flush=True)
    if args.dry_run:
        return 0
    return supervise(plan.argv, rank_layout(hosts, min(cfg.np, hosts.total_slots)))


def supervise(argv: tuple[str, ...], layout) -> int:
    """Run horovodrun, pass its output through, and on failure add one line: which rank, where, why.

    Termination signals sent to hvdkit are passed on to horovodrun (Ctrl-C
    reaches both, as they share the terminal's process group). The exit code
    is horovodrun's (128 + N when a signal N ended it).
    """
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
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
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: proc.send_signal(number))
    while True:
        try:
            rc = proc.wait()
            break
        except KeyboardInterrupt:  # horovodrun got the same SIGINT; wait for it to wind the job down
            continue
    for reader in readers:
        reader.join(timeout=5)
    if rc != 0:
        why = explain_failure("".join(tail), layout)
        print(f"hvdkit launch: job failed: {why or f'horovodrun exited with status {rc}'} "
              "(its own output is above)", file=sys.stderr, flush=True)
    return rc if rc >= 0 else 128 - rc
