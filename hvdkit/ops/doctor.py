"""Pre-flight checks for multi-host launches, each a row with pass/fail and a fix.

Per host: ssh as the launcher will use it, the same Python/hvdkit/Horovod/framework
versions as the driver, Horovod's build flags, slots versus GPUs (or CPU
cores), and the network interfaces; then one interface common to all hosts and
a small cross-host allreduce. A GPU host whose /dev/shm is too small for NCCL
(a plain ``docker run``) gets an ``hvdkit:`` warning line, not a failure.
Every remote call has a timeout, so a dead host costs seconds, not a hang.

Example::

    hosts = parse_hosts_string("a:2,b:2")
    report = run_doctor(DoctorConfig(LaunchTarget(np=hosts.total_slots, hosts=hosts, ssh_port=12345)))
    print(render(report)); sys.exit(0 if report.ok else 1)
"""

from __future__ import annotations

import json
import re
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace

from hvdkit.common.console import text_table
from hvdkit.common.shared_memory import small_shm_warning
from hvdkit.ops.envreport import EnvReport, collect
from hvdkit.ops.hosts import HostSpec, is_this_machine
from hvdkit.ops.launch import BuildFlags, LaunchTarget, plan_launch
from hvdkit.ops.procs import run_bounded
from hvdkit.ops.remote import SSH_CONNECT_TIMEOUT_S, last_line, ssh_argv, ssh_fix_hint

REMOTE_TIMEOUT_S = 60
ALLREDUCE_TIMEOUT_S = 90
# Compared across hosts: a mismatch in any of these breaks or skews a job.
COMPARED_PACKAGES = ("torch", "tensorflow", "keras", "horovod")


@dataclass(frozen=True)
class DoctorConfig:
    """The hosts to check, reached as a job would be: the :class:`LaunchTarget` and controller launch would use."""

    target: LaunchTarget
    allreduce: bool = True
    controller: str = "auto"      # --mpi / --gloo, as for launch

    @property
    def hosts(self) -> HostSpec:
        return self.target.hosts

    @property
    def ssh_port(self) -> int | None:
        return self.target.ssh_port

    @property
    def ssh_identity_file(self) -> str | None:
        return self.target.ssh_identity_file

    @property
    def network_interface(self) -> str | None:
        return self.target.network_interface

    @property
    def python(self) -> str:
        return self.target.python


@dataclass
class Check:
    host: str
    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass
class DoctorReport:
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0
    network_interface: str | None = None
    warnings: list[str] = field(default_factory=list)    # "hvdkit: ..." lines: a job may run, but slower or worse

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "seconds": round(self.seconds, 2), "network_interface": self.network_interface,
                "checks": [asdict(c) for c in self.checks], "warnings": self.warnings}


def check_host(host: str, cfg: DoctorConfig, driver: EnvReport, slots: int) -> tuple[list[Check], EnvReport | None]:
    """ssh, versions, build flags and slots for one host; returns its env report when reachable."""
    checks: list[Check] = []
    report = _remote_report(host, cfg, checks)
    if report is None:
        return checks, None
    checks += [_versions(host, report, driver), _horovod_build(host, report, driver), _slots(host, report, slots)]
    return checks, report


def _remote_report(host: str, cfg: DoctorConfig, checks: list[Check]) -> EnvReport | None:
    """``hvdkit env --json`` on ``host`` (over ssh unless local); appends the ssh check, and hvdkit's if it fails."""
    remote = f"{shlex.quote(cfg.python)} -m hvdkit env --json"
    if is_this_machine(host):           # launch's own answer: it does not ssh to this machine either
        argv = [cfg.python, "-m", "hvdkit", "env", "--json"]
        checks.append(Check(host, "ssh", True, "local host: no ssh needed"))
    else:
        rc, _, err = run_bounded(ssh_argv(host, "true", cfg.ssh_port, cfg.ssh_identity_file),
                                 SSH_CONNECT_TIMEOUT_S + 10)
        if rc != 0:
            last = last_line(err, rc)
            checks.append(Check(host, "ssh", False, last, ssh_fix_hint(host, err, cfg.ssh_port)))
            return None
        checks.append(Check(host, "ssh", True, f"port {cfg.ssh_port or 22}, key-only"))
        argv = ssh_argv(host, remote, cfg.ssh_port, cfg.ssh_identity_file)
    rc, out, err = run_bounded(argv, REMOTE_TIMEOUT_S)
    try:
        return EnvReport.from_dict(json.loads(out))
    except (json.JSONDecodeError, TypeError):
        last = last_line(err, rc)
        checks.append(Check(host, "hvdkit", False, f"'{remote}' failed: {last}",
                            f"install hvdkit at {cfg.python} on {host} (the same path as here; use the same image)"))
        return None


def _versions(host: str, report: EnvReport, driver: EnvReport) -> Check:
    diffs = []
    if report.python != driver.python:
        diffs.append(f"python {report.python} (driver {driver.python})")
    if report.hvdkit != driver.hvdkit:
        diffs.append(f"hvdkit {report.hvdkit} (driver {driver.hvdkit})")
    for name in COMPARED_PACKAGES:
        if report.packages.get(name) != driver.packages.get(name):
            diffs.append(f"{name} {report.packages.get(name)} (driver {driver.packages.get(name)})")
    return Check(host, "versions", not diffs, "; ".join(diffs) or
                 f"python {report.python}, hvdkit {report.hvdkit}, horovod {report.packages.get('horovod')}",
                 "" if not diffs else f"install the driver's versions on {host}: run scripts/install.sh there "
                 "from the same checkout (or use the same image)")


def _horovod_build(host: str, report: EnvReport, driver: EnvReport) -> Check:
    hb, db = report.horovod, driver.horovod
    if hb is None:
        return Check(host, "horovod build", False, report.horovod_error or "unusable",
                     f"rebuild Horovod on {host} with scripts/install.sh")
    same = db is not None and hb.controllers == db.controllers and hb.frameworks == db.frameworks
    flags = ", ".join(k for d in (hb.frameworks, hb.controllers) for k, v in d.items() if v)
    return Check(host, "horovod build", same, flags,
                 "" if same else f"rebuild Horovod on {host} with the same scripts/install.sh mode")


def _slots(host: str, report: EnvReport, slots: int) -> Check:
    if report.gpus:
        ok = len(report.gpus) >= slots
        return Check(host, "slots", ok, f"{slots} slots, {len(report.gpus)} GPUs",
                     "" if ok else f"lower {host}'s slots to {len(report.gpus)} (one process per GPU)")
    ok = slots <= report.cpu_count
    return Check(host, "slots", ok, f"CPU host: {slots} slots, {report.cpu_count} cores",
                 "" if ok else f"lower {host}'s slots to {report.cpu_count} (its CPU cores) or use a GPU host")


def common_interface(reports: dict[str, EnvReport], requested: str | None,
                     local_only: bool) -> tuple[Check, str | None]:
    """One interface name present, with an IPv4 address, on every host; returns (check, name to use)."""
    if requested:
        missing = [h for h, r in reports.items() if requested not in r.interfaces]
        if missing:
            h = missing[0]
            return Check(h, "network", False, f"interface {requested} is missing on {', '.join(missing)} "
                         f"({h} has {', '.join(reports[h].interfaces) or 'none'})",
                         "pass --network-interface with a name every host has"), None
        return Check("*", "network", True, f"{requested} on every host"), requested
    names = set.intersection(*(set(r.interfaces) for r in reports.values())) if reports else set()
    routable = sorted(n for n in names if local_only or not all(a.startswith("127.") for r in reports.values()
                                                                   for a in r.interfaces[n]))
    if not routable:
        listing = "; ".join(f"{h}: {', '.join(r.interfaces)}" for h, r in reports.items())
        return Check("*", "network", False, "no interface name with a routable address is common to all hosts "
                                            f"({listing})",
                     "give the hosts' interfaces one name, or use NCCL_SOCKET_IFNAME/--network-interface "
                     "per host"), None
    if local_only:
        return Check("*", "network", True, "local job: loopback"), None
    check = Check("*", "network", True, f"common: {', '.join(routable)} (use --network-interface {routable[0]})")
    return check, routable[0]


def cross_host_allreduce(cfg: DoctorConfig, interface: str | None, build: BuildFlags | None = None) -> Check:
    """A one-float allreduce over the job's ranks (``python -m hvdkit.selfcheck``), launched as ``hvdkit launch``
    would launch the job: the same hosts, -np and controller (:func:`hvdkit.ops.launch.plan_launch`)."""
    target = replace(cfg.target, network_interface=interface or cfg.target.network_interface)
    launch = target.launch_config((cfg.python, "-m", "hvdkit.selfcheck"), controller=cfg.controller)
    plan = plan_launch(launch, build or BuildFlags.detect())
    argv = list(plan.argv)
    start = time.time()
    rc, out, err = run_bounded(argv, ALLREDUCE_TIMEOUT_S, group=True)   # a hung job's ranks end with it
    ranks = selfcheck_results(out)
    ok = rc == 0 and sorted(ranks) == list(range(target.np)) and all(good for _, good in ranks.values())
    hosts = sorted({host for host, _ in ranks.values()})
    detail = (f"{len(ranks)} ranks on {', '.join(hosts)} over {plan.controller} in {time.time() - start:.1f}s" if ok
              else f"exit {rc}, {len(ranks)} of {target.np} ranks reported: "
                   f"{((err or out).strip().splitlines() or ['no output'])[-1][:200]}")
    fix = "" if ok else "run the command by hand with --verbose: " + shlex.join(argv)
    return Check("*", "allreduce", ok, detail, fix)


_SELFCHECK = re.compile(r"hvdkit-selfcheck rank=(\d+) size=\d+ host=(\S+) framework=\S+ ok=(True|False)")


def selfcheck_results(output: str) -> dict[int, tuple[str, bool]]:
    """Each rank's (host, ok) from ``python -m hvdkit.selfcheck``'s lines, found anywhere in the output:
    mpirun's output tags may put two ranks' lines on one line."""
    return {int(rank): (host, ok == "True") for rank, host, ok in _SELFCHECK.findall(output)}


def shm_warnings(reports: dict[str, EnvReport]) -> list[str]:
    """One line per host with GPUs whose /dev/shm is smaller than NCCL needs (a CPU host is never warned)."""
    lines = [small_shm_warning(r.shm_bytes, host) for host, r in reports.items() if r.gpus]
    return [line for line in lines if line]


def run_doctor(cfg: DoctorConfig) -> DoctorReport:
    start = time.time()
    driver = collect()
    report = DoctorReport()
    slots = {h.name: h.slots for h in cfg.hosts.hosts}
    with ThreadPoolExecutor(max_workers=min(16, len(slots))) as pool:
        results = list(pool.map(lambda h: check_host(h, cfg, driver, slots[h]), slots))
    reports = {}
    for host, (checks, env) in zip(slots, results):
        report.checks += checks
        if env is not None:
            reports[host] = env
    report.warnings = shm_warnings(reports)
    if len(reports) == len(slots):
        net, report.network_interface = common_interface(reports, cfg.network_interface, cfg.hosts.is_local_only())
        report.checks.append(net)
        if cfg.allreduce and report.ok:
            report.checks.append(cross_host_allreduce(cfg, report.network_interface))
    report.seconds = time.time() - start
    return report


def render(report: DoctorReport) -> str:
    rows = [("host", "check", "result", "detail / fix")]
    for c in report.checks:
        rows.append((c.host, c.name, "pass" if c.ok else "FAIL", c.detail + (f"  -> {c.fix}" if c.fix else "")))
    verdict = "all checks passed" if report.ok else f"{sum(not c.ok for c in report.checks)} check(s) failed"
    return "\n".join([text_table(rows, align='llll'), *report.warnings, f"{verdict} in {report.seconds:.1f}s"])
