"""deploy/kubernetes/mpijob.yaml's launcher command on test hosts laid out as the MPI Operator's pods of
hvdkit's image (tests/multihost/operator_pods.py): the key Secret mounted at /root/.ssh as the kubelet
does it, workers reached as <job>-worker-<i>.<job>.default.svc, the image's own docker/sshd_config,
docker/ssh_config and entrypoint. Only the training script is swapped for a one-allreduce worker."""

import json
import os
import re
import sys

import pytest
import yaml

from tests.conftest import ROOT, hvdkit_cmd, job_env
from tests.multihost.conftest import require_root
from tests.multihost.operator_pods import OperatorPods

pytestmark = pytest.mark.multihost
WORKER = ROOT / "tests" / "multihost" / "workers" / "allreduce_hosts.py"


@pytest.fixture(scope="module")
def pods():
    require_root()
    with OperatorPods("hvdjob", workers=2) as made:
        yield made


def launcher_env(pods) -> dict[str, str]:
    """The launcher container's environment: the image's ENV and what the operator adds for Open MPI
    (pkg/controller/mpi_job_controller.go, ompiEnvVars)."""
    return job_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_orte_keep_fqdn_hostnames="true", OMPI_MCA_orte_default_hostfile=str(pods.hostfile),
                   OMPI_MCA_plm_rsh_args="-o ConnectionAttempts=10")


def test_plain_ssh_reaches_a_worker_by_its_service_name(pods):
    """What Open MPI's launcher does: `ssh <fqdn> cmd`, no port or key options, so both come from the image's
    ssh_config; the worker's sshd must take the key from the Secret's layout."""
    worker = pods.fqdn(pods.workers[0])
    proc = pods.run_on(pods.launcher, ["ssh", "-o", "BatchMode=yes", worker, "hostname"], timeout=30,
                       env=launcher_env(pods))
    assert proc.returncode == 0 and proc.stdout.strip() == pods.workers[0], proc.stdout + pods.sshd_logs()


def test_static_mpijob_launcher_runs_across_two_workers(pods):
    job = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "mpijob.yaml").read_text())
    args = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
    hostfile = pods.write_hostfile(slots=1)
    # The manifest's command with the sizes of this stand-in (2 workers x 1 slot), the image's paths
    # replaced by this machine's, and the training script by one allreduce.
    args = [a for a in args[:args.index("--")]]
    args[args.index("-np") + 1] = "2"
    args[args.index("--hostfile") + 1] = str(hostfile)
    assert args[0] == "hvdkit" and "--mpi" in args
    argv = hvdkit_cmd(*args[1:], "--", sys.executable, str(WORKER))
    proc = pods.run_on(pods.launcher, argv, timeout=180, env=launcher_env(pods))
    assert proc.returncode == 0, proc.stdout[-3000:] + pods.sshd_logs()
    result = json.loads(re.search(r'(\{"size".*\})', proc.stdout).group(1))
    assert result == {"size": 2, "hosts": pods.workers, "sum": 3.0}


def test_sigterm_to_a_worker_pods_pid_1_ends_in_a_checkpoint_and_exit_75(pods, tmp_path):
    """Issue 34, case 8: an evicted pod's SIGTERM reaches its PID 1 alone. The image's worker ran sshd there,
    which exited without passing it on, and the kernel then killed every rank: no checkpoint. The entrypoint
    now passes it to the pod's ranks and waits for them; the launcher's hvdkit launch exits 75."""
    import signal
    import time

    from tests.conftest import WORKERS

    out, ckpt = tmp_path / "out", tmp_path / "ckpt.pt"
    out.mkdir()
    job = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "mpijob.yaml").read_text())
    args = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
    args = args[:args.index("--")]
    args[args.index("-np") + 1] = "2"
    args[args.index("--hostfile") + 1] = str(pods.write_hostfile(slots=1))
    argv = hvdkit_cmd(*args[1:], "--", sys.executable, str(WORKERS / "torch_preempt.py"), "--out", str(out),
                      "--ckpt", str(ckpt), "--step-seconds", "0.2")
    launcher = pods.spawn_on(pods.launcher, argv, env=launcher_env(pods))
    try:
        deadline = time.time() + 120
        while not ((out / "progress").exists() and (out / "progress").read_text().split()[-1:] >= ["3"]):
            assert time.time() < deadline and launcher.poll() is None, launcher.stdout.read()[-3000:]
            time.sleep(0.2)
        os.kill(pods.sshd[pods.workers[1]].pid, signal.SIGTERM)       # the kubelet's SIGTERM to PID 1
        output, _ = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        pods.sshd[pods.workers[1]].wait(timeout=60)
        pid1_log = (pods.tmp / pods.workers[1] / "sshd.log").read_text()
        pods.start_worker(pods.workers[1])               # the pod restarted, for the module's other tests
    assert launcher.returncode == 75, output[-3000:] + pods.sshd_logs()
    marks = [json.loads((out / f"preempted{r}.json").read_text()) for r in range(2)]
    assert marks[0]["batch"] == marks[1]["batch"] and signal.SIGTERM in (marks[0]["signal"], marks[1]["signal"])
    assert ckpt.exists(), "the checkpoint was written before the pod's processes ended"
    assert "hvdkit-entrypoint: SIGTERM: passing it to 1 rank(s)" in pid1_log, pid1_log
