"""`hvdkit launch --dry-run` for elastic jobs: the discovery script is run once and the plan printed."""

import subprocess

import pytest

from tests.conftest import ROOT, run_hvdkit

pytestmark = pytest.mark.cli


def dry_run(tmp_path, lines: str, *extra: str) -> subprocess.CompletedProcess:
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nprintf '{lines}'\n")
    script.chmod(0o755)
    return run_hvdkit("launch", "-np", "2", "--host-discovery-script", str(script), *extra, "--dry-run",
                      "--", "python", str(ROOT / "examples" / "pytorch_elastic.py"), timeout=120)


def test_elastic_dry_run_on_this_machine_names_the_loopback(tmp_path):
    proc = dry_run(tmp_path, "localhost:2\\n", "--max-np", "4")
    assert proc.returncode == 0, proc.stderr
    command = proc.stdout.splitlines()[0]
    assert "-np 2 --min-np 2 --max-np 4 --host-discovery-script" in command
    assert command.endswith("--gloo --network-interface lo python " + str(ROOT / "examples" / "pytorch_elastic.py"))
    assert proc.stderr.count("warning") == 1 and "every slot is on one host line (localhost:2)" in proc.stderr


def test_elastic_dry_run_warns_that_one_host_line_cannot_survive_a_failure_and_says_how(tmp_path):
    """Measured: localhost:3, one worker SIGKILLed: 'blacklisted slots count == 3 -> stop running', exit 1."""
    proc = dry_run(tmp_path, "localhost:3\n", "--min-np", "2")
    assert proc.returncode == 0, proc.stderr
    assert ("every slot is on one host line (localhost:3): Horovod blacklists the host of a failed worker, so one "
            "failure stops all 3 workers and the job; to survive one, list the machine once per slot") in proc.stderr


def test_the_machine_listed_once_per_slot_is_planned_on_the_loopback_without_a_warning(tmp_path):
    import socket

    proc = dry_run(tmp_path, f"localhost:1\\n127.0.0.1:1\\n{socket.gethostname()}:1\\n", "--min-np", "2")
    assert proc.returncode == 0, proc.stderr
    assert "--network-interface lo" in proc.stdout and "warning" not in proc.stderr


def test_elastic_dry_run_warns_when_the_script_lists_too_few_slots(tmp_path):
    proc = dry_run(tmp_path, "localhost:1\\n", "--min-np", "1", "--elastic-timeout", "45")
    assert proc.returncode == 0, proc.stderr
    assert "--elastic-timeout 45" in proc.stdout
    assert ("lists 1 slots, fewer than -np 2; horovodrun waits for more, for up to 45 s") in proc.stderr


def test_elastic_dry_run_refuses_one_remote_host_without_an_interface(tmp_path):
    proc = dry_run(tmp_path, "gpu1:8\\n")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "needs --network-interface" in proc.stderr and "gpu1" in proc.stderr


def test_this_machine_by_its_own_name_is_local_to_launch_doctor_and_bench(tmp_path):
    """Issue 37: -H $(hostname):2 was local to launch, but doctor ssh'd to itself and bench train left DDP out.
    Real commands, no ssh server on this machine: doctor's checks and its allreduce pass without one."""
    import json
    import socket

    me = f"{socket.gethostname()}:2"
    doctor = run_hvdkit("doctor", "-H", me, "--json", timeout=180)
    report = json.loads(doctor.stdout)
    assert doctor.returncode == 0, doctor.stdout[-3000:]
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["ssh"]["detail"] == "local host: no ssh needed"
    assert "2 ranks on" in checks["allreduce"]["detail"] and "over mpi" in checks["allreduce"]["detail"]
    launch = run_hvdkit("launch", "--dry-run", "-H", me, "--", "python", "-c", "pass", timeout=60)
    assert launch.returncode == 0 and f"-np 2 -H {me} --mpi" in launch.stdout, launch.stdout
    bench = run_hvdkit("bench", "train", "-H", me, "--models", "mnist", "--impls", "hvdkit,ddp", "--dry-run",
                       "--out", str(tmp_path), timeout=60)
    assert bench.returncode == 0 and "torch.distributed.run" in bench.stdout, bench.stdout + bench.stderr


def test_hosts_shows_where_each_rank_runs_and_converts_to_a_hostfile():
    """README and docs/MULTIHOST.md: `hvdkit hosts -H server1:4,server2:4`, as written there."""
    table = run_hvdkit("hosts", "-H", "server1:4,server2:4", timeout=60)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == "2 host(s), 8 slots, np=8  (horovodrun -np 8 -H server1:4,server2:4)"
    assert [line.split() for line in lines[2:]] == [[str(r), f"server{1 + r // 4}", str(r % 4)] for r in range(8)]
    hostfile = run_hvdkit("hosts", "-H", "server1:4,server2:4", "--to", "hostfile", timeout=60)
    assert hostfile.stdout == "server1 slots=4\nserver2 slots=4\n"


def test_launch_names_a_missing_program_in_one_line():
    proc = run_hvdkit("launch", "--dry-run", "-np", "2", "-H", "localhost:2", "--", "nosuchprog", "x.py", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "hvdkit launch: error: program 'nosuchprog' is not found on this machine (not on PATH): give its path, or "
        "activate the environment that has it"]
