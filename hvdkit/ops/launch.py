"""Launch as plan, then execute: a pure function turns a typed config into the horovodrun command.

Example::

    cfg = LaunchConfig(np=4, hosts=parse_hosts_string("a:2,b:2"), command=("python", "train.py"), ssh_port=12345)
    plan = plan_launch(cfg, BuildFlags(mpi=True, gloo=True))
    plan.argv   # ('horovodrun', '-np', '4', '-H', 'a:2,b:2', '--mpi', '-p', '12345', 'python', 'train.py')
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass

from hvdkit.common.errors import UserError
from hvdkit.common.files import writable_free_bytes
from hvdkit.ops.envreport import probe_horovod
from hvdkit.ops.hosts import HostSpec, RankPlacement, is_this_machine, rank_layout, to_hosts_string
from hvdkit.ops.remote import horovodrun_path

CONTROLLERS = ("auto", "mpi", "gloo")


@dataclass(frozen=True)
class BuildFlags:
    """The controllers the installed Horovod was built with, and whether it has NCCL (from ``hvdkit env``)."""

    mpi: bool
    gloo: bool
    nccl: bool = False         # the GPU flavour: NCCL carries the gradients, the controller only negotiates

    @classmethod
    def detect(cls) -> BuildFlags:
        """The installed Horovod's controllers; UserError naming the fix when Horovod is not usable."""
        build, error = probe_horovod()
        if build is None:
            raise UserError(f"Horovod is not usable here ({error}): run scripts/install.sh")
        return cls(mpi=build.controllers["mpi"], gloo=build.controllers["gloo"], nccl=bool(build.nccl_version))


@dataclass(frozen=True)
class LaunchConfig:
    np: int
    hosts: HostSpec | None
    command: tuple[str, ...]
    controller: str = "auto"
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    network_interface: str | None = None
    horovodrun: str = "horovodrun"
    # Elastic mode (any of these set): Horovod restarts the workers on a new
    # host set instead of ending the job. With a discovery script, `hosts` is
    # what the script printed at launch (used for checks, not passed on).
    min_np: int | None = None
    max_np: int | None = None
    discovery_script: str | None = None
    slots: int | None = None               # slots of a discovered host printed without ":N" (horovodrun --slots)
    elastic_timeout: int | None = None     # seconds to wait for enough slots (horovodrun: 600)
    reset_limit: int | None = None         # resizes allowed before the job ends (horovodrun: no limit)
    # Horovod's timeline, written by rank 0 on its host (read it with `hvdkit timeline`).
    timeline: str | None = None

    @property
    def elastic(self) -> bool:
        return any(v is not None for v in (self.min_np, self.max_np, self.discovery_script,
                                            self.elastic_timeout, self.reset_limit))


@dataclass(frozen=True)
class LaunchTarget:
    """Where a job's processes run and how horovodrun reaches the hosts: what launch, doctor and bench share.

    The one place a :class:`LaunchConfig` is filled from them::

        target = LaunchTarget(np=4, hosts=parse_hosts_string("a:2,b:2"), ssh_port=12345)
        cfg = target.launch_config(("python", "train.py"), controller="gloo")
    """

    np: int
    hosts: HostSpec | None
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    network_interface: str | None = None
    python: str = sys.executable       # its horovodrun (the venv's) launches the job

    def launch_config(self, command: tuple[str, ...], controller: str = "auto", **elastic) -> LaunchConfig:
        """``command`` on this target; ``elastic`` takes LaunchConfig's elastic fields (min_np=..., ...)
        and ``timeline``."""
        return LaunchConfig(np=self.np, hosts=self.hosts, command=tuple(command), controller=controller,
                            ssh_port=self.ssh_port, ssh_identity_file=self.ssh_identity_file,
                            network_interface=self.network_interface, horovodrun=horovodrun_path(self.python),
                            **elastic)


@dataclass(frozen=True)
class LaunchPlan:
    argv: tuple[str, ...]
    controller: str
    reason: str
    layout: tuple[RankPlacement, ...] = ()   # where each rank starts, to name the one that fails

    def shell(self) -> str:
        return shlex.join(self.argv)


def choose_controller(requested: str, build: BuildFlags, hosts: HostSpec | None = None,
                      np: int | None = None) -> tuple[str, str]:
    """``--mpi``/``--gloo`` when asked; else the controller measured faster for this job, among those built.

    - Ranks on one machine (whatever ``-H`` lists beyond the first ``np``
      slots): MPI. Over shared memory Horovod's MPI allreduce took 1.1-30 ms
      against Gloo's 4.3-66 ms from 1 to 64 MiB (docs/bench/controller_choice.txt;
      also ``make bench``: 1.78 against 1.00 GB/s at 16 MiB).
    - Ranks on several machines, CPU (a build without NCCL): Gloo. Over TCP
      Open MPI's allreduce is not a ring: Horovod on Gloo was faster than
      Horovod on MPI with Open MPI's choice in 11 of 12 (hosts, size) cells
      from 2 to 4 hosts and 1 to 64 MiB, and than MPI with the ring forced
      (coll_tuned_allreduce_algorithm=4) in 11 of 12, e.g. 4 hosts at 16 MiB
      428 ms against 920 and 524 ms. The forced ring won 3 hosts at 64 MiB
      (by 13%); Open MPI's choice 4 hosts at 1 MiB (by 5%); 3 hosts at 16 MiB
      was a tie (418 against 422 ms). Single rounds at load 2.5-4.
    - Several machines with NCCL (the GPU flavour): MPI. NCCL moves the
      gradients and the controller only negotiates, so Gloo's TCP ring buys
      nothing there (not measured: no GPU). A NCCL build on CPU hosts keeps
      MPI too: pass --gloo there.
    - Hosts from a Slurm allocation (``--slurm``, or none given inside one):
      MPI, before speed. Open MPI's mpirun starts its daemons on the other
      nodes with srun, so their ranks run in the job's step with the GPUs and
      CPUs Slurm gave that node; horovodrun's Gloo starts them over ssh,
      outside the job, where Slurm sets no CUDA_VISIBLE_DEVICES
      (tests/multihost/test_slurm.py records both).
    """
    if requested not in CONTROLLERS:
        raise UserError(f"controller {requested!r} is unknown: use one of {', '.join(CONTROLLERS)}")
    if requested == "mpi" and not build.mpi:
        raise UserError("--mpi asked for, but Horovod was built without MPI: use --gloo, or rebuild with "
                        "scripts/install.sh after installing OpenMPI")
    if requested == "gloo" and not build.gloo:
        raise UserError("--gloo asked for, but Horovod was built without Gloo: use --mpi or rebuild with "
                        "scripts/install.sh")
    if requested != "auto":
        return requested, "asked for"
    multi_host = len(machines(hosts, np)) > 1
    if multi_host and build.mpi and hosts is not None and hosts.source == "slurm":
        return "mpi", ("hosts from the Slurm allocation: mpirun starts the other nodes' ranks with srun, inside the "
                       "job with the GPUs Slurm gave each node (--gloo starts them over ssh, outside it)")
    if multi_host and not build.nccl and build.gloo:
        return "gloo", ("ranks on several hosts, CPU: Horovod's Gloo ring beat MPI's allreduce over TCP "
                        "(docs/bench/controller_choice.txt); --mpi to override")
    if build.mpi:
        if multi_host:
            return "mpi", "Horovod has NCCL, which carries the gradients; MPI only negotiates (--gloo to override)"
        return "mpi", "one host: MPI's shared-memory allreduce is faster than Gloo's (--gloo to override)"
    if build.gloo:
        return "gloo", "Horovod was built without MPI"
    raise UserError("Horovod was built with neither MPI nor Gloo: rebuild it with scripts/install.sh")


def machines(hosts: HostSpec | None, np: int | None = None) -> set[str]:
    """The machines the first ``np`` slots of ``hosts`` are on; this machine, under any of its names, counts once."""
    if hosts is None:
        return set()
    names = [p.host for p in rank_layout(hosts, np)] if np is not None and np <= hosts.total_slots else hosts.names
    return {"this machine" if is_this_machine(name) else name for name in names}


def check_command(command: tuple[str, ...], exists=os.path.exists) -> None:
    """The training command must be given, and a script it names must exist."""
    if not command:
        raise UserError("no training command: put it after '--', e.g. hvdkit launch -np 2 -H localhost:2 -- "
                        "python train.py")
    for arg in command[1:2] if os.path.basename(command[0]).startswith("python") else command[:1]:
        if arg.endswith(".py") and not exists(arg):
            raise UserError(f"script {arg!r} does not exist: check the path (it is resolved on every host "
                            "from the directory you launch in)")


def check_program(command: tuple[str, ...], hosts: HostSpec, which=shutil.which) -> None:
    """On a job of this machine only, the program the command starts must exist here (on other hosts it is
    resolved there). Open MPI would say it in a page of text and exit 134."""
    if not all(is_this_machine(h.name) for h in hosts.hosts) or which(command[0]) is not None:
        return
    where = "no such executable file" if "/" in command[0] else "not on PATH"
    raise UserError(f"program {command[0]!r} is not found on this machine ({where}): give its path, or activate "
                    "the environment that has it")


def check_timeline(path: str, hosts: HostSpec | None) -> None:
    """Stop before launching when rank 0 cannot write Horovod's timeline at ``path`` (an absolute path).

    Horovod creates no directory, and when rank 0 cannot open the file it logs
    one error among the ranks' output and trains on: the job exits 0 with no
    timeline. Checked where rank 0 runs on this machine (the first host);
    another host's file system is not visible from here::

        check_timeline("/tmp/runs/tl.json", parse_hosts_string("localhost:2"))   # UserError: mkdir -p /tmp/runs
    """
    if hosts is None or not is_this_machine(hosts.hosts[0].name):
        return
    directory = os.path.dirname(path)
    if os.path.isdir(path):
        raise UserError(f"--timeline {path!r} is a directory: give a file name, e.g. {path}/timeline.json")
    if not os.path.isdir(directory):
        if os.path.exists(directory):
            raise UserError(f"--timeline {path!r}: {directory!r} is not a directory: choose a file in a directory")
        raise UserError(f"--timeline {path!r}: directory {directory!r} does not exist and Horovod does not create "
                        f"it: mkdir -p {directory}, or choose another path")
    try:
        writable_free_bytes(directory)
    except OSError as exc:
        raise UserError(f"--timeline {path!r}: cannot write in {directory!r}: {exc.strerror or exc} (errno "
                        f"{exc.errno}): choose a directory you can write to") from None


def plan_launch(cfg: LaunchConfig, build: BuildFlags) -> LaunchPlan:
    """Validate ``cfg`` and return the horovodrun command that runs it. Pure: reads no files, runs nothing."""
    if cfg.ssh_port is not None and not 0 < cfg.ssh_port < 65536:
        raise UserError(f"ssh port {cfg.ssh_port} is out of range: use 1-65535 (hvdkit's image uses 12345)")
    nic = cfg.network_interface
    if cfg.elastic:
        argv, controller, reason = _elastic_argv(cfg, build)
        if nic is None:
            nic, why = _elastic_nic(cfg)
            reason += f"; {why}"
    else:
        if cfg.hosts is None:
            raise UserError("no hosts given: pass -H host1:N,host2:N, --hostfile FILE or "
                            "--host-discovery-script SCRIPT")
        controller, reason = choose_controller(cfg.controller, build, cfg.hosts, cfg.np)
        argv = [cfg.horovodrun, "-np", str(cfg.np), "-H", to_hosts_string(cfg.hosts), f"--{controller}"]
    if cfg.ssh_port is not None:
        argv += ["-p", str(cfg.ssh_port)]
    if cfg.ssh_identity_file:
        argv += ["--ssh-identity-file", cfg.ssh_identity_file]
    if nic:
        argv += ["--network-interface", nic]
    if cfg.timeline:
        # Without the response cache every negotiation records when each rank was ready; with it (Horovod's
        # default) only a tensor's first does (hvdkit.ops.timeline).
        argv += ["--timeline-filename", cfg.timeline, "--cache-capacity", "0"]
    argv += cfg.command
    return LaunchPlan(tuple(argv), controller, reason, _layout(cfg))


def _layout(cfg: LaunchConfig) -> tuple[RankPlacement, ...]:
    """Where each rank starts; this is where -np is checked against the slots.

    A discovery script may list fewer slots than -np (horovodrun then waits
    for more), so its layout covers the slots listed at launch.
    """
    if cfg.hosts is None:
        return ()
    np = min(cfg.np, cfg.hosts.total_slots) if cfg.discovery_script is not None else cfg.np
    return tuple(rank_layout(cfg.hosts, np))


def _elastic_argv(cfg: LaunchConfig, build: BuildFlags) -> tuple[list[str], str, str]:
    """horovodrun's elastic flags, checked against the rules horovodrun itself enforces only after start-up."""
    min_np = cfg.np if cfg.min_np is None else cfg.min_np
    if not 1 <= min_np <= cfg.np:
        raise UserError(f"--min-np {min_np} must be between 1 and -np {cfg.np}: the job starts with -np processes "
                        "and carries on while at least --min-np remain")
    if cfg.max_np is not None and cfg.max_np < cfg.np:
        raise UserError(f"--max-np {cfg.max_np} is below -np {cfg.np}: raise --max-np or lower -np")
    if cfg.controller == "mpi":
        raise UserError("elastic jobs run on Gloo (Horovod's elastic mode has no MPI controller): drop --mpi")
    if not build.gloo:
        raise UserError("elastic training needs Horovod built with Gloo: rebuild it with scripts/install.sh")
    argv = [cfg.horovodrun, "-np", str(cfg.np), "--min-np", str(min_np)]
    if cfg.max_np is not None:
        argv += ["--max-np", str(cfg.max_np)]
    if cfg.elastic_timeout is not None:
        argv += ["--elastic-timeout", str(cfg.elastic_timeout)]
    if cfg.reset_limit is not None:
        argv += ["--reset-limit", str(cfg.reset_limit)]
    if cfg.discovery_script is not None:
        argv += ["--host-discovery-script", cfg.discovery_script]
        if cfg.slots is not None:
            argv += ["--slots", str(cfg.slots)]
    elif cfg.hosts is None:
        raise UserError("an elastic job needs its hosts: pass --host-discovery-script SCRIPT "
                        "(examples/discover_hosts.sh reads a hosts file you can edit while it runs)")
    elif len(cfg.hosts.hosts) < 2:
        # horovodrun's own rule for a fixed host list (it cannot blacklist its only host).
        raise UserError(f"an elastic job on a fixed {cfg.hosts.source} list needs 2 or more hosts, got "
                        f"{to_hosts_string(cfg.hosts)}: list more hosts, or use --host-discovery-script "
                        "examples/discover_hosts.sh")
    else:
        argv += ["-H", to_hosts_string(cfg.hosts)]
    return argv + ["--gloo"], "gloo", "elastic training runs on Gloo"


def one_host_elastic_risk(hosts: HostSpec | None) -> str | None:
    """Why an elastic job whose slots all sit on one host line cannot survive a failed worker, and the fix.

    Horovod blacklists the *host* of a failed worker, so every worker on it
    goes and the job ends (measured: ``localhost:3``, one worker killed, the
    job ended). Each name is a host to Horovod, and any name that resolves to
    this machine runs locally: listing the machine once per slot under
    different names keeps a failure to one slot.
    """
    if hosts is None or len(hosts.hosts) != 1 or hosts.hosts[0].slots < 2:
        return None
    host = hosts.hosts[0]
    return (f"every slot is on one host line ({host.name}:{host.slots}): Horovod blacklists the host of a failed "
            f"worker, so one failure stops all {host.slots} workers and the job; to survive one, list the machine "
            "once per slot under names that all resolve to it (e.g. localhost:1, 127.0.0.1:1 and the host name, "
            "or aliases added to /etc/hosts)")


def _elastic_nic(cfg: LaunchConfig) -> tuple[str | None, str]:
    """The interface an elastic job needs named: horovodrun's elastic mode finds a
    common interface by asking two hosts, so without --network-interface a job on
    one host waits (600 s by default) for a second that never comes, then fails."""
    if cfg.hosts is None:
        return None, "horovodrun finds the common network interface"
    if cfg.hosts.is_local_only():
        return "lo", ("--network-interface lo, as every host is this machine "
                      "(pass --network-interface to grow onto other hosts)")
    if len(cfg.hosts.hosts) >= 2:
        return None, "horovodrun finds the common network interface"
    raise UserError(f"an elastic job starting on one host ({cfg.hosts.hosts[0].name}) needs --network-interface: "
                    "horovodrun otherwise waits for a second host to compare interfaces; pass the one your "
                    "hosts share, e.g. --network-interface eth0")
