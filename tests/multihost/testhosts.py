"""Real test hosts on one machine: network namespaces on a bridge, each with its
own hostname (UTS namespace), /etc/hosts entry and sshd (port 12345, key-only).

    with TestHosts(["hosta", "hostb"]) as cluster:
        cluster.run_on("hosta", ["horovodrun", "-np", "4", "-H", "hosta:2,hostb:2", "-p", "12345", ...])

Everything made is recorded and removed on exit, even when a test fails:
sshd process groups, namespaces (and any process left in them), the bridge,
/etc/hosts lines, the ssh client config and the keys. Needs root,
iproute2 and openssh-server (scripts/install.sh installs them).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PORT = 12345
SUBNET = "10.77.0"
BRIDGE = "hvdk-br0"
MARKER = "# hvdkit-testhosts"
ETC_HOSTS = Path("/etc/hosts")
SSH_CLIENT_CONFIG = Path("/etc/ssh/ssh_config.d/hvdkit-testhosts.conf")


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


@dataclass
class HostOptions:
    """Per-host variations, to make faults for `hvdkit doctor` to find."""

    interface: str = "eth0"
    sshd: bool = True
    # file -> replacement, bind-mounted in this host's own mount namespace
    # (a different installed version on one host, with a shared filesystem).
    overlay: dict[str, str] = field(default_factory=dict)


class TestHosts:
    __test__ = False  # a fixture helper, not a test class (its name starts with "Test")
    def __init__(self, names: list[str], options: dict[str, HostOptions] | None = None):
        self.names = names
        self.options = options or {}
        self.tmp = Path(tempfile.mkdtemp(prefix="hvdkit-testhosts-"))
        self.key = self.tmp / "client_key"
        self.ips = {name: f"{SUBNET}.{i + 2}" for i, name in enumerate(names)}
        self.sshd: dict[str, subprocess.Popen] = {}
        self._namespaces: list[str] = []
        self._bridge = False

    # -- set up ---------------------------------------------------------------
    def __enter__(self) -> "TestHosts":
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def ns(self, name: str) -> str:
        return f"hvdk-{name}"

    def _setup(self) -> None:
        self._remove_leftovers()
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        self._bridge = True
        sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for i, name in enumerate(self.names):
            ns, opt = self.ns(name), self.options.get(name, HostOptions())
            sh("ip", "netns", "add", ns)
            self._namespaces.append(ns)
            outer, inner = f"hvdk-v{i}", f"hvdk-v{i}p"
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "link", "set", outer, "master", BRIDGE, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", inner, "name", opt.interface)
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.ips[name]}/24", "dev", opt.interface)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", opt.interface, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        with ETC_HOSTS.open("a") as f:
            f.write("".join(f"{ip} {name} {MARKER}\n" for name, ip in self.ips.items()))
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))
        (self.tmp / "authorized_keys").write_text((self.tmp / "client_key.pub").read_text())
        SSH_CLIENT_CONFIG.parent.mkdir(parents=True, exist_ok=True)
        SSH_CLIENT_CONFIG.write_text(
            f"{MARKER}\nHost {' '.join(self.names)}\n  Port {PORT}\n  IdentityFile {self.key}\n"
            "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
        Path("/run/sshd").mkdir(exist_ok=True)
        for name in self.names:
            if self.options.get(name, HostOptions()).sshd:
                self.start_sshd(name)

    def start_sshd(self, name: str) -> None:
        host_key = self.tmp / f"{name}_host_key"
        if not host_key.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
        config = self.tmp / f"{name}_sshd_config"
        config.write_text(
            f"Port {PORT}\nHostKey {host_key}\nPidFile {self.tmp / name}.pid\n"
            f"AuthorizedKeysFile {self.tmp / 'authorized_keys'}\nStrictModes no\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
            "PermitRootLogin prohibit-password\nPubkeyAuthentication yes\nAcceptEnv *\n")
        opt = self.options.get(name, HostOptions())
        mounts = "".join(f"mount --bind {src} {dst}; " for dst, src in opt.overlay.items())
        unshare = ["unshare", "--uts"] + (["--mount"] if opt.overlay else [])
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(name), *unshare, "sh", "-c",
             f"{mounts}hostname {name}; exec /usr/sbin/sshd -D -f {config} -E {self.tmp / name}.sshd.log"],
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.sshd[name] = proc
        deadline = time.time() + 15
        while time.time() < deadline:
            try:
                socket.create_connection((self.ips[name], PORT), timeout=0.5).close()
                return
            except OSError:
                if proc.poll() is not None:
                    log = (self.tmp / f"{name}.sshd.log").read_text()
                    raise RuntimeError(f"sshd for {name} exited: {log}") from None
                time.sleep(0.1)
        raise RuntimeError(f"sshd for {name} did not listen on {self.ips[name]}:{PORT} within 15s")

    def stop_sshd(self, name: str) -> None:
        proc = self.sshd.pop(name, None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    # -- shaped links ---------------------------------------------------------
    def shape_links(self, mbit: float, queue_ms: float = 5) -> None:
        """Limit each host's link to ``mbit`` Mbit/s each way (tc's token bucket filter on both veth ends).

        What a host sends leaves its own interface; what it receives leaves the
        bridge's end of its veth. Shaping both makes each host's link a
        full-duplex link of that rate, as a switch port is: a parameter server
        receiving from N workers at once gets ``mbit`` in all, not N times it.
        The network, not the shared cores, becomes the bottleneck. Rate only:
        this kernel has no netem, so no added latency (``tc qdisc add ... netem``
        fails with "Specified qdisc kind is unknown"). The bucket holds at least
        128 KiB, since a veth hands tc 64 KiB GSO packets. Each end queues at
        most ``queue_ms`` of traffic, a switch port's shallow buffer: with 50 ms,
        Open MPI's allreduce ran at 60% of the link, its control messages
        stuck behind the other direction's data (Gloo's streams were not).
        """
        rate = int(mbit * 1e6 / 8)                                   # bytes per second
        burst = max(rate // 250, 128 * 1024)
        tbf = ["root", "tbf", "rate", f"{rate}bps", "burst", str(burst), "latency", f"{queue_ms:g}ms"]
        for i, name in enumerate(self.names):
            dev = self.options.get(name, HostOptions()).interface
            sh("ip", "netns", "exec", self.ns(name), "tc", "qdisc", "replace", "dev", dev, *tbf)
            sh("tc", "qdisc", "replace", "dev", f"hvdk-v{i}", *tbf)

    def clear_links(self) -> None:
        """Back to unshaped veths (memory speed)."""
        for i, name in enumerate(self.names):
            dev = self.options.get(name, HostOptions()).interface
            sh("ip", "netns", "exec", self.ns(name), "tc", "qdisc", "del", "dev", dev, "root", check=False)
            sh("tc", "qdisc", "del", "dev", f"hvdk-v{i}", "root", check=False)

    def link_qdisc(self, name: str) -> str:
        """tc's qdiscs on both ends of ``name``'s link: its interface, then the bridge's end."""
        dev = self.options.get(name, HostOptions()).interface
        return (sh("ip", "netns", "exec", self.ns(name), "tc", "qdisc", "show", "dev", dev).stdout
                + sh("tc", "qdisc", "show", "dev", f"hvdk-v{self.names.index(name)}").stdout)

    # -- use ------------------------------------------------------------------
    def run_on(self, name: str, argv: list[str], timeout: float,
               env: dict | None = None) -> subprocess.CompletedProcess:
        """Run a command inside host ``name`` (its network and hostname), killing its group on timeout.

        Also on any other way out (pytest-timeout's exception, Ctrl-C, SIGTERM turned into SystemExit):
        the command runs in a session of its own, so nothing else would stop it."""
        proc = subprocess.Popen(self.enter(name, " ".join(_quote(a) for a in argv)),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise TimeoutError(f"{argv[0]} on {name} ran past {timeout}s:\n{out[-3000:]}") from None
        except BaseException:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            raise
        return subprocess.CompletedProcess(argv, proc.returncode, out, "")

    def spawn_on(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        """Start a command inside host ``name`` and return at once (stdout piped, own process group)."""
        return subprocess.Popen(self.enter(name, " ".join(_quote(a) for a in argv)),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, start_new_session=True)

    def enter(self, name: str, command: str) -> list[str]:
        """The argv that runs the shell ``command`` inside host ``name``: its network namespace and hostname."""
        return ["ip", "netns", "exec", self.ns(name), "unshare", "--uts", "sh", "-c",
                f"hostname {name}; exec {command}"]

    # -- tear down --------------------------------------------------------------
    def close(self) -> None:
        for name in list(self.sshd):
            self.stop_sshd(name)
        # Delete the veth pairs explicitly: `ip netns del` returns before the kernel has
        # torn down the namespace's links, and the next cluster's names would collide.
        for i in range(len(self._namespaces)):
            sh("ip", "link", "del", f"hvdk-v{i}", check=False)
        for ns in self._namespaces:
            pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:                      # anything a test left running in the host
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            sh("ip", "netns", "del", ns, check=False)
        self._namespaces.clear()
        if self._bridge:
            sh("ip", "link", "del", BRIDGE, check=False)
            self._bridge = False
        _strip_marked_lines(ETC_HOSTS)
        if SSH_CLIENT_CONFIG.exists() and MARKER in SSH_CLIENT_CONFIG.read_text():
            SSH_CLIENT_CONFIG.unlink()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _remove_leftovers(self) -> None:
        """A run killed before teardown may have left its hosts; clear them first."""
        for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
            ns = line.split()[0] if line.strip() else ""
            if ns.startswith("hvdk-"):
                sh("ip", "netns", "del", ns, check=False)
        for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if line.count(":") >= 2 else ""
            if name.startswith("hvdk-"):
                sh("ip", "link", "del", name, check=False)
        deadline = time.time() + 10                 # links of deleted namespaces go asynchronously
        while "hvdk-" in sh("ip", "-o", "link", "show", check=False).stdout and time.time() < deadline:
            time.sleep(0.1)
        _strip_marked_lines(ETC_HOSTS)


def _strip_marked_lines(path: Path) -> None:
    """Remove the test hosts' lines. They were appended, so usually one truncate removes them: other tests
    resolve names meanwhile (make test's other lane), and a file rewritten in place is empty for a moment."""
    text = path.read_text()
    if MARKER not in text:
        return
    kept = "".join(line for line in text.splitlines(keepends=True) if MARKER not in line)
    if text.startswith(kept):
        os.truncate(path, len(kept.encode()))
    else:
        path.write_text(kept)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
