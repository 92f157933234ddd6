"""A real Slurm cluster over the test hosts: slurmctld on the bridge, one slurmd inside each host.

    with SlurmHosts(["hosta", "hostb"]) as cluster:
        job = cluster.sbatch(["srun", "--mpi=pmix", "python", "train.py"], nodes=2, tasks_per_node=2)
        cluster.wait(job, timeout=300)           # -> (state, output)

Debian's slurm-wlm (scripts/install.sh installs it for the tests) as root, with
``AuthType=auth/none`` and every state, spool, pid and log file under the
cluster's temp dir. slurmd runs in its host's network and UTS namespaces, so
jobs see that host's name and address, as on separate machines. Everything is
removed on exit with the rest of the test hosts, even when a test fails.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

from tests.multihost.testhosts import SUBNET, TestHosts

CTLD_PORT, SLURMD_PORT = 16917, 16918


class SlurmHosts(TestHosts):
    __test__ = False

    def __init__(self, names: list[str], cpus_per_host: int = 2, gpus_per_host: int = 0):
        super().__init__(names)
        self.cpus = cpus_per_host
        self.gpus = gpus_per_host
        self.conf = self.tmp / "slurm.conf"
        self.daemons: list[subprocess.Popen] = []

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def _setup(self) -> None:
        super()._setup()
        for d in ("state", "pmix", *(f"spool/{n}" for n in self.names), *(f"pmix-{n}" for n in self.names)):
            (self.tmp / d).mkdir(parents=True)
        # The hosts share one filesystem, and Slurm's PMIx plugin makes the same directory name
        # on every node of a step (spmix_appdir_<uid>_<job>.<step>): give each host its own.
        (self.tmp / "mpi.conf").write_text(f"PMIxCliTmpDirBase={self.tmp / 'pmix'}\n")
        gres, gres_types = (self._fake_gpus(), "GresTypes=gpu\n") if self.gpus else ("", "")
        me = socket.gethostname()   # slurmctld refuses to run unless SlurmctldHost names this machine
        nodes = "".join(f"NodeName={n} NodeAddr={self.ips[n]} CPUs={self.cpus}{gres} State=UNKNOWN\n"
                        for n in self.names)
        self.conf.write_text(
            f"ClusterName=hvdkittest\nSlurmctldHost={me}({SUBNET}.1)\nSlurmUser=root\nSlurmdUser=root\n"
            "AuthType=auth/none\nCredType=cred/none\nMpiDefault=none\nProctrackType=proctrack/linuxproc\n"
            "TaskPlugin=task/none\nSelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
            f"SlurmctldPort={CTLD_PORT}\nSlurmdPort={SLURMD_PORT}\n"
            f"StateSaveLocation={self.tmp}/state\nSlurmdSpoolDir={self.tmp}/spool/%n\n"
            f"SlurmctldPidFile={self.tmp}/slurmctld.pid\nSlurmdPidFile={self.tmp}/slurmd-%n.pid\n"
            f"SlurmctldLogFile={self.tmp}/slurmctld.log\nSlurmdLogFile={self.tmp}/slurmd-%n.log\n"
            "SlurmdParameters=config_overrides\nReturnToService=2\nInactiveLimit=0\nKillWait=5\n"
            # A requeued job waits cred_expire + 1 s before it may start (120 s by default), then for the
            # main scheduling loop (every 60 s): 190 of the requeue test's 264 s were that wait. 60 s, not
            # Slurm's 5 s minimum: the credential also bounds how late a launch may reach a loaded slurmd.
            "AuthInfo=cred_expire=60\nSchedulerParameters=sched_interval=5\n"
            f"{gres_types}{nodes}PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n")
        self.daemons.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(self.conf)], start_new_session=True,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for name in self.names:
            # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup hierarchy slurmd needs.
            self.daemons.append(subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{self.ns(name)}", "unshare", "--uts", "--mount", "--propagation",
                 "private", "sh", "-c", f"hostname {name}; mount --bind {self.tmp / f'pmix-{name}'} "
                                        f"{self.tmp / 'pmix'}; exec slurmd -D -f {self.conf} -N {name}"],
                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.time() + 30
        while time.time() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%n %t"], capture_output=True, text=True, env=self.env).stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if len(states) == len(self.names) and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.5)
        raise RuntimeError(f"Slurm nodes not idle within 30s: {out!r}\n{self.logs()}")

    def _fake_gpus(self) -> str:
        """GPU GRES backed by stand-in device files; returns the node lines' Gres= field.

        Slurm 22.05's slurmd stats each gres.conf File= and drops any that is not a
        character or block device ("is not a valid character or block device, fix your
        gres.conf", src/plugins/gres/common/gres_common.c), so regular files do not do:
        these are character devices with the NVIDIA driver's major number (195), as
        /dev/nvidia0..N are. Slurm only stats them; nothing opens them.
        """
        dev = self.tmp / "dev"
        dev.mkdir()
        for i in range(self.gpus):
            os.mknod(dev / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(195, i))
        (self.tmp / "gres.conf").write_text(f"Name=gpu File={dev}/nvidia[0-{self.gpus - 1}]\n")
        return f" Gres=gpu:{self.gpus}"

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.tmp.glob("*.log"))
                         if p.name.startswith("slurm"))

    def sbatch(self, script: str, nodes: int, tasks_per_node: int, env: dict | None = None) -> tuple[str, Path]:
        """Submit ``script`` (a bash script body) and return (job id, output file)."""
        path = self.tmp / f"job-{len(list(self.tmp.glob('job-*.sh')))}.sh"
        path.write_text("#!/bin/bash\n" + script)
        return self.sbatch_file(path, ["-N", str(nodes), f"--ntasks-per-node={tasks_per_node}"], env)

    def sbatch_file(self, path: Path, options: list[str], env: dict | None = None,
                    cwd: Path | None = None) -> tuple[str, Path]:
        """Submit the batch script at ``path`` as it is, with sbatch ``options`` before it; (job id, output file).

        Only the output file is named here (in the cluster's temp dir); everything else
        comes from the script's #SBATCH lines and ``options``.
        """
        out = self.tmp / f"{path.stem}-{len(list(self.tmp.glob('*.out')))}.out"
        proc = subprocess.run(["sbatch", "--parsable", "-o", str(out), *options, str(path)], capture_output=True,
                              text=True, timeout=30, env={**self.env, **(env or {})}, cwd=cwd)
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch failed: {proc.stderr}")
        return proc.stdout.strip().split(";")[0], out

    def wait(self, job: str, output: Path, timeout: float) -> tuple[str, str]:
        """Wait until the job leaves the queue; (its final state, its output). Cancels it on timeout."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True,
                                   env=self.env).stdout
            match = re.search(r"JobState=(\w+)", state)
            if match and match.group(1) not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return match.group(1), output.read_text() if output.exists() else ""
            time.sleep(1)
        subprocess.run(["scancel", job], env=self.env, capture_output=True)
        raise TimeoutError(f"Slurm job {job} ran past {timeout}s:\n"
                           f"{output.read_text()[-3000:] if output.exists() else ''}\n{self.logs()}")

    def close(self) -> None:
        for proc in reversed(self.daemons):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.daemons:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.daemons.clear()
        super().close()   # also kills what a job left in the hosts' namespaces (slurmstepd, ranks)
