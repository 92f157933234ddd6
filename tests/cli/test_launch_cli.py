"""`hvdkit launch --dry-run` for elastic jobs: the discovery script is run once and the plan printed."""

import subprocess

import pytest

from tests.conftest import BIN, ROOT, job_env

pytestmark = pytest.mark.cli


def dry_run(tmp_path, lines: str, *extra: str) -> subprocess.CompletedProcess:
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nprintf '{lines}'\n")
    script.chmod(0o755)
    argv = [str(BIN / "hvdkit"), "launch", "-np", "2", "--host-discovery-script", str(script), *extra, "--dry-run",
            "--", "python", str(ROOT / "examples" / "pytorch_elastic.py")]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=job_env(), cwd=ROOT)


def test_elastic_dry_run_on_this_machine_names_the_loopback(tmp_path):
    proc = dry_run(tmp_path, "localhost:2\\n", "--max-np", "4")
    assert proc.returncode == 0, proc.stderr
    command = proc.stdout.splitlines()[0]
    assert "-np 2 --min-np 2 --max-np 4 --host-discovery-script" in command
    assert command.endswith("--gloo --network-interface lo python " + str(ROOT / "examples" / "pytorch_elastic.py"))
    assert "warning" not in proc.stderr


def test_elastic_dry_run_warns_when_the_script_lists_too_few_slots(tmp_path):
    proc = dry_run(tmp_path, "localhost:1\\n", "--min-np", "1", "--elastic-timeout", "45")
    assert proc.returncode == 0, proc.stderr
    assert "--elastic-timeout 45" in proc.stdout
    assert ("lists 1 slots, fewer than -np 2; horovodrun waits for more, for up to 45 s") in proc.stderr


def test_elastic_dry_run_refuses_one_remote_host_without_an_interface(tmp_path):
    proc = dry_run(tmp_path, "gpu1:8\\n")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "needs --network-interface" in proc.stderr and "gpu1" in proc.stderr
