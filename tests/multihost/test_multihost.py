"""Two test hosts (network namespaces + sshd on 12345): training across hosts, and hvdkit doctor's faults."""

import json
import re
import sys
import time

import pytest

from hvdkit.ops.doctor import ALLREDUCE_TIMEOUT_S, REMOTE_TIMEOUT_S
from hvdkit.ops.remote import SSH_CONNECT_TIMEOUT_S
from tests.conftest import BIN, ROOT, hvdkit_cmd, job_env, run_job
from tests.multihost.testhosts import PORT

pytestmark = pytest.mark.multihost
EXAMPLE = [sys.executable, str(ROOT / "examples" / "pytorch_mnist.py"), "--epochs", "4", "--json"]
HOSTS = "hosta:2,hostb:2"
# Tensor fusion packs whichever gradients are ready in a cycle into one buffer, so an
# element's place in the ring (its float32 summation order) changes from run to run;
# measured: 0.2% apart in test loss after 4 epochs. Without fusion the order is fixed,
# so the cross-host and single-host runs can be compared exactly.
DETERMINISTIC = {"HOROVOD_FUSION_THRESHOLD": "0"}


def result_of(output: str) -> dict:
    match = re.search(r'(\{"dataset".*\})', output)
    assert match, output[-3000:]
    return json.loads(match.group(1))


@pytest.fixture(scope="module")
def single_host_result():
    """The same job as 4 processes on one host: the reference for the cross-host runs."""
    proc = run_job([str(BIN / "horovodrun"), "-np", "4", "-H", "localhost:4", "--gloo", *EXAMPLE], timeout=300,
                   env=job_env(**DETERMINISTIC))
    assert proc.returncode == 0, proc.stdout[-3000:]
    return result_of(proc.stdout)


def check_same(result, reference):
    assert result["size"] == 4 and result["hosts"] == 2 and reference["hosts"] == 1
    assert result["test_accuracy"] == reference["test_accuracy"]
    assert result["test_loss"] == pytest.approx(reference["test_loss"], rel=1e-6)


def test_example_across_two_hosts_with_plain_horovodrun(cluster, single_host_result):
    argv = [str(BIN / "horovodrun"), "-np", "4", "-H", HOSTS, "-p", str(PORT), "--gloo",
            "--network-interface", "eth0", *EXAMPLE]
    proc = cluster.run_on("hosta", argv, timeout=300, env=job_env(**DETERMINISTIC))
    assert proc.returncode == 0, proc.stdout[-3000:]
    check_same(result_of(proc.stdout), single_host_result)


@pytest.mark.parametrize("controller", ["", "--mpi"])    # "" is --gloo across hosts: one job checks both
def test_example_across_two_hosts_with_hvdkit_launch(cluster, single_host_result, controller):
    """"": launch's own choice, which across CPU hosts is Gloo since issue 37 (it was MPI, 1.8-3.3x the ring's
    time over TCP from 4 MiB up on 3-4 hosts); the plan line says so and how to override it."""
    argv = hvdkit_cmd("launch", "-np", "4", "-H", HOSTS, "-p", str(PORT), *([controller] if controller else []),
                      "--network-interface", "eth0", "--", *EXAMPLE)
    proc = cluster.run_on("hosta", argv, timeout=300, env=job_env(**DETERMINISTIC))
    assert proc.returncode == 0, proc.stdout[-3000:]
    used = controller or "--gloo"
    assert f"hvdkit launch: {BIN / 'horovodrun'} -np 4 -H {HOSTS} {used} -p {PORT}" in proc.stdout
    if not controller:
        assert "(gloo: ranks on several hosts, CPU" in proc.stdout and "--mpi to override" in proc.stdout
    result = result_of(proc.stdout)
    assert result["size"] == 4 and result["hosts"] == 2 and result["test_accuracy"] > 0.5
    if used == "--gloo":     # same collective algorithm as the reference, so the same numbers
        check_same(result, single_host_result)


# Bounds from doctor's own timeouts, not from this machine's speed: CI runs these tests beside image builds on 2
# cores, where the hosts' `hvdkit env` alone took longer than the fixed 30 s and 60 s they once had.
# A check that waited for its timeout took at least REMOTE_TIMEOUT_S; a refused connection takes under a second.
NO_TIMEOUT_HIT_S = REMOTE_TIMEOUT_S
DOCTOR_AT_MOST_S = SSH_CONNECT_TIMEOUT_S + 10 + REMOTE_TIMEOUT_S + ALLREDUCE_TIMEOUT_S + 30


def doctor(cluster, *args, timeout=DOCTOR_AT_MOST_S):
    start = time.time()
    proc = cluster.run_on("hosta", hvdkit_cmd("doctor", "--json", *args), timeout=timeout, env=job_env())
    elapsed = time.time() - start
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    return proc.returncode, report, elapsed


def failed(report):
    return [(c["host"], c["name"], c["detail"], c["fix"]) for c in report["checks"] if not c["ok"]]


def test_doctor_passes_on_a_healthy_cluster(cluster):
    rc, report, elapsed = doctor(cluster, "-H", HOSTS, "-p", str(PORT))
    assert rc == 0 and report["ok"], failed(report)
    assert report["network_interface"] == "eth0"
    allreduce = [c for c in report["checks"] if c["name"] == "allreduce"][0]
    assert "4 ranks on hosta, hostb" in allreduce["detail"]
    assert elapsed < REMOTE_TIMEOUT_S + ALLREDUCE_TIMEOUT_S    # neither timed out
    # Issue 37: doctor ran its allreduce on Gloo while launch ran MPI; now it checks the job launch would run.
    plan = cluster.run_on("hosta", hvdkit_cmd("launch", "--dry-run", "-H", HOSTS, "-p", str(PORT), "--", "python",
                                              "-c", "pass"), timeout=60, env=job_env()).stdout
    controller = plan.split("\n  (", 1)[1].split(":", 1)[0]
    assert controller in ("mpi", "gloo") and f"over {controller} " in allreduce["detail"], (plan, allreduce)


def test_doctor_names_a_host_whose_sshd_is_down(cluster):
    cluster.stop_sshd("hostb")
    try:
        rc, report, elapsed = doctor(cluster, "-H", HOSTS, "-p", str(PORT))
    finally:
        cluster.start_sshd("hostb")
    assert rc == 1 and elapsed < NO_TIMEOUT_HIT_S
    ((host, name, detail, fix),) = failed(report)
    assert (host, name) == ("hostb", "ssh") and "Connection refused" in detail
    assert "start sshd there" in fix


def test_doctor_names_a_wrong_ssh_port(cluster):
    rc, report, elapsed = doctor(cluster, "-H", HOSTS, "-p", str(PORT + 1))
    assert rc == 1 and elapsed < NO_TIMEOUT_HIT_S
    # hosta is where doctor runs: this machine, which launch does not ssh to either (issue 37: doctor did).
    assert {(h, n) for h, n, _, _ in failed(report)} == {("hostb", "ssh")}
    assert all(f"{PORT + 1}" in fix for _, _, _, fix in failed(report))
    hosta_ssh = [c for c in report["checks"] if (c["host"], c["name"]) == ("hosta", "ssh")]
    assert hosta_ssh[0]["ok"] and hosta_ssh[0]["detail"] == "local host: no ssh needed"


def test_doctor_names_slots_above_what_the_host_has(cluster):
    rc, report, elapsed = doctor(cluster, "-H", "hosta:2,hostb:64", "-p", str(PORT), "--no-allreduce")
    assert rc == 1 and elapsed < NO_TIMEOUT_HIT_S
    ((host, name, detail, fix),) = failed(report)
    assert (host, name) == ("hostb", "slots") and "64 slots" in detail and "lower hostb's slots" in fix


RECEIVE = """
import socket, sys, time
server = socket.create_server(("0.0.0.0", 5201))
print("listening", flush=True)
conn, _ = server.accept()
got, start = 0, None
while chunk := conn.recv(1 << 20):
    start = start or time.perf_counter()
    got += len(chunk)
print(f"received {got} bytes in {time.perf_counter() - start:.4f} s", flush=True)
"""
SEND = ("import socket, sys; s = socket.create_connection((sys.argv[1], 5201)); "
        "s.sendall(bytes(int(sys.argv[2]))); s.close()")


def transfer_mbit(cluster, nbytes: int) -> float:
    """Mbit/s of one TCP stream from hosta to hostb, as the receiver timed it."""
    receiver = cluster.spawn_on("hostb", [sys.executable, "-c", RECEIVE])
    try:
        assert receiver.stdout.readline().strip() == "listening"
        sent = cluster.run_on("hosta", [sys.executable, "-c", SEND, cluster.ips["hostb"], str(nbytes)], timeout=60)
        assert sent.returncode == 0, sent.stdout
        out, _ = receiver.communicate(timeout=60)
    finally:
        receiver.kill()
    got, seconds = re.search(r"received (\d+) bytes in ([\d.]+) s", out).groups()
    assert int(got) == nbytes
    return int(got) * 8 / float(seconds) / 1e6


def test_shaped_links_carry_the_rate_asked_for_and_clear_afterwards(cluster):
    # The multi-host benchmark's network: tc's token bucket on each host's interface (issue 26).
    unshaped = transfer_mbit(cluster, 50_000_000)
    cluster.shape_links(200)
    try:
        assert cluster.link_qdisc("hosta").count("rate 200Mbit") == 2    # both ends: sending and receiving
        shaped = transfer_mbit(cluster, 10_000_000)
    finally:
        cluster.clear_links()
    assert "tbf" not in cluster.link_qdisc("hosta")
    print(f"unshaped {unshaped:.0f} Mbit/s, shaped to 200: {shaped:.0f} Mbit/s")
    assert 170 <= shaped <= 215, shaped          # the bucket's first 128 KiB go at line speed
    assert unshaped > 5 * shaped, unshaped
