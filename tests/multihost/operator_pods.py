"""Test hosts laid out like the pods the Kubeflow MPI Operator (v2beta1, v0.8.2) makes of hvdkit's image.

    with OperatorPods("hvdjob", workers=2) as pods:
        pods.run_on("hvdjob-launcher", ["hvdkit", "launch", "--hostfile", pods.hostfile, ...], timeout=120)

A launcher and N workers, each a test host (network namespace, hostname) whose
commands run in a mount namespace of their own that holds what the image and
the operator put there:

- /etc/ssh as Dockerfile.gpu leaves it: the distribution's sshd_config and
  ssh_config (both Include their .d directories) with no host keys, and
  docker/sshd_config and docker/ssh_config as sshd_config.d/hvdkit.conf and
  ssh_config.d/hvdkit.conf, the only files there;
- /root/.ssh as the kubelet mounts the operator's key Secret at sshAuthMountPath
  (pkg/controller/mpi_job_controller.go: items id_rsa, id_rsa.pub, authorized_keys,
  defaultMode 0600 when the path is /root/.ssh; an ECDSA P-521 key in PEM).
  A Secret volume is an emptyDir of medium Memory: a tmpfs mounted with no mode=,
  so its root is 1777 (pkg/volume/emptydir/empty_dir.go, setupTmpfs), written by
  the atomic writer (pkg/volume/util/atomic_writer.go): the files in a timestamped
  directory chmod 0755, `..data` a symlink to it, each file a symlink
  `..data/<file>`; mounted read-only in the container (secret.go: ReadOnly);
- a fresh /run (sshd's pid file and privilege-separation directory);
- /root the image's (0700), with the machine's /root entries bound back in (the
  tests' Python lives under it).

Workers run the image's own entrypoint, `docker/entrypoint.sh sshd`. The job's
Service DNS is /etc/hosts lines for `<pod>.<job>.<namespace>.svc`, the names the
operator's hostfile and discover_hosts.sh use. Everything goes with the test
hosts: the mounts live only in the pods' namespaces, whose processes are killed.
"""

from __future__ import annotations

import os
import random
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.conftest import ROOT
from tests.multihost.testhosts import ETC_HOSTS, MARKER, PORT, HostOptions, TestHosts

NAMESPACE = "default"
SSHD_CONFIG = ROOT / "docker" / "sshd_config"
SSH_CONFIG = ROOT / "docker" / "ssh_config"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
# The operator's Secret, as the volume's items name its keys (mpi_job_controller.go: sshVolumeItems).
SECRET_FILES = ("id_rsa", "id_rsa.pub", "authorized_keys")
SECRET_MODE = 0o600


class OperatorPods(TestHosts):
    __test__ = False

    def __init__(self, job: str, workers: int, sshd_config: Path = SSHD_CONFIG, ssh_config: Path = SSH_CONFIG):
        self.job = job
        self.launcher = f"{job}-launcher"
        self.workers = [f"{job}-worker-{i}" for i in range(workers)]
        names = [self.launcher, *self.workers]
        super().__init__(names, {n: HostOptions(sshd=False) for n in names})
        self.image_files = {"sshd_config.d/hvdkit.conf": sshd_config, "ssh_config.d/hvdkit.conf": ssh_config}
        self.hostfile = self.tmp / "hostfile"

    def fqdn(self, pod: str) -> str:
        return f"{pod}.{self.job}.{NAMESPACE}.svc"

    def _setup(self) -> None:
        super()._setup()
        with ETC_HOSTS.open("a") as f:          # the job's headless Service
            f.write("".join(f"{self.ips[p]} {self.fqdn(p)} {MARKER}\n" for p in self.names))
        secret = self.tmp / "secret"
        secret.mkdir()
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-m", "PEM", "-N", "", "-f",
                        str(secret / "id_rsa")], check=True, capture_output=True)
        shutil.copy(secret / "id_rsa.pub", secret / "authorized_keys")
        for pod in self.names:
            self._image_etc_ssh(pod)
            (self.tmp / pod / "realroot").mkdir()
        for pod in self.workers:
            self.start_worker(pod)

    def _image_etc_ssh(self, pod: str) -> None:
        etc = self.tmp / pod / "etc-ssh"
        shutil.copytree("/etc/ssh", etc, ignore=shutil.ignore_patterns("ssh_host_*"))
        for name, source in self.image_files.items():
            shutil.rmtree(etc / name.split("/")[0])           # only the image's file there (not this machine's)
            (etc / name).parent.mkdir()
            shutil.copy(source, etc / name)

    def start_worker(self, pod: str) -> None:
        """The worker container: the image's entrypoint with `sshd` (host keys, then sshd -D -e)."""
        log = self.tmp / pod / "sshd.log"
        with log.open("w") as out:
            self.sshd[pod] = subprocess.Popen(self.enter(pod, f"{shlex.quote(str(ENTRYPOINT))} sshd"),
                                              stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                socket.create_connection((self.ips[pod], PORT), timeout=0.5).close()
                return
            except OSError:
                if self.sshd[pod].poll() is not None:
                    raise RuntimeError(f"{pod}'s entrypoint exited: {log.read_text()}") from None
                time.sleep(0.1)
        raise RuntimeError(f"{pod}'s sshd did not listen on {self.ips[pod]}:{PORT} within 20s: {log.read_text()}")

    def sshd_logs(self) -> str:
        return "\n".join(f"--- {pod} sshd\n{(self.tmp / pod / 'sshd.log').read_text()[-2000:]}" for pod in self.workers)

    def write_hostfile(self, slots: int) -> Path:
        """/etc/mpi/hostfile as the operator writes it for Open MPI: `<fqdn> slots=N` per worker."""
        self.hostfile.write_text("".join(f"{self.fqdn(p)} slots={slots}\n" for p in self.workers))
        return self.hostfile

    def enter(self, name: str, command: str) -> list[str]:
        pod = self.tmp / name
        real_root = pod / "realroot"
        bring_back = "".join(
            f"{'mkdir' if (Path('/root') / e).is_dir() else 'touch'} /root/{q}; "
            f"mount --bind {real_root}/{q} /root/{q}; "
            for e in sorted(os.listdir("/root")) if e != ".ssh" for q in [shlex.quote(e)])
        ts = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime()) + str(random.randrange(10 ** 9))
        secret = self.tmp / "secret"
        layout = "".join(f"cp {secret}/{f} /root/.ssh/{ts}/{f}; chmod {SECRET_MODE:o} /root/.ssh/{ts}/{f}; "
                         f"ln -s ..data/{f} /root/.ssh/{f}; " for f in SECRET_FILES)
        setup = (
            "set -e; "
            f"mount --bind /root {real_root}; mount -t tmpfs -o mode=0700 tmpfs /root; {bring_back}"
            "mkdir -m 0700 /root/.ssh; mount -t tmpfs -o size=1m tmpfs /root/.ssh; "
            f"mkdir /root/.ssh/{ts}; chmod 0755 /root/.ssh/{ts}; {layout}ln -s {ts} /root/.ssh/..data; "
            "mount -o remount,ro /root/.ssh; "
            f"mount --bind {pod / 'etc-ssh'} /etc/ssh; "
            "mount -t tmpfs -o mode=0755 tmpfs /run; mkdir -m 0755 /run/sshd; "
            f"hostname {name}; set +e; "
        )
        return ["ip", "netns", "exec", self.ns(name), "unshare", "--uts", "--mount", "--propagation", "private",
                "sh", "-c", f"{setup}exec {command}"]
