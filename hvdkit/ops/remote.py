"""Running commands on the job's hosts: ssh as horovodrun does it, every call bounded by a timeout.

Used by ``hvdkit doctor`` (its per-host checks) and ``hvdkit launch`` (the
quick ssh-and-version check before a job, and an elastic job's discovery
script run once up front).

Example::

    rc, out, err = run_bounded(ssh_argv("server1", "true", port=12345, identity=None), timeout=15)
    quick_check(["server1", "server2"], port=12345, identity=None)   # raises UserError naming the fix
"""

from __future__ import annotations

import os
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor

import hvdkit
from hvdkit.common.errors import UserError
from hvdkit.ops.hosts import HostSpec, is_this_machine, parse_discovery_output
from hvdkit.ops.procs import run_bounded

SSH_CONNECT_TIMEOUT_S = 5
DISCOVERY_TIMEOUT_S = 30


def horovodrun_path(python: str = sys.executable) -> str:
    """The horovodrun beside ``python`` (the venv's), else whichever is on the PATH."""
    launcher = os.path.join(os.path.dirname(python), "horovodrun")
    return launcher if os.path.exists(launcher) else "horovodrun"


def ssh_argv(host: str, remote_command: str, port: int | None, identity: str | None) -> list[str]:
    """ssh with the options horovodrun uses, plus batch mode and a connect timeout."""
    argv = ["ssh", "-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
            "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}"]
    if port is not None:
        argv += ["-p", str(port)]
    if identity:
        argv += ["-i", identity]
    return argv + [host, remote_command]


def last_line(err: str, rc: int) -> str:
    """The last line a failed command wrote to stderr (usually its reason), or its exit status."""
    return (err.strip().splitlines() or [f"exit {rc}"])[-1]


def ssh_fix_hint(host: str, err: str, port: int | None) -> str:
    p = port or 22
    if "Connection refused" in err:
        return f"nothing listens on {host}:{p}: start sshd there, or pass the port it uses with -p"
    if "Permission denied" in err:
        return f"{host} refused the key: add your public key to {host}:~/.ssh/authorized_keys or pass -i KEY"
    if "Could not resolve" in err or "Name or service not known" in err:
        return f"{host} does not resolve: add it to /etc/hosts or DNS on the driver"
    if "timed out" in err or "no answer" in err or "No route" in err:
        return f"{host} did not answer: check that it is up and reachable from this machine"
    return f"make 'ssh -p {p} {host} true' work without a prompt"


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
                            f"on {host} from the same checkout (or use the same image); "
                            "'hvdkit doctor' compares all versions")


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
        raise UserError(f"discovery script {script} failed ({last_line(err, rc)}): run it by hand and fix it; "
                        "it must print host:slots lines and exit 0")
    return parse_discovery_output(out, script, default_slots)
