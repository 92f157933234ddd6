"""hvdkit doctor on clusters built with one fault each (own module: these hosts reuse the shared names)."""

import sys
import time

import pytest

from tests.conftest import ROOT, hvdkit_cmd, job_env
from tests.multihost.test_multihost import HOSTS, NO_TIMEOUT_HIT_S, doctor, failed
from tests.multihost.testhosts import PORT, HostOptions

pytestmark = pytest.mark.multihost


def test_doctor_names_an_interface_missing_on_one_host(make_cluster):
    cluster = make_cluster({"hostb": HostOptions(interface="ens5")})
    rc, report, elapsed = doctor(cluster, "-H", HOSTS, "-p", str(PORT), "--network-interface", "eth0")
    assert rc == 1 and elapsed < NO_TIMEOUT_HIT_S
    ((host, name, detail, _),) = failed(report)
    assert (host, name) == ("hostb", "network") and "eth0 is missing on hostb (hostb has ens5" in detail


def test_doctor_names_a_host_with_another_hvdkit_version(make_cluster, tmp_path):
    init = ROOT / "hvdkit" / "__init__.py"
    other = tmp_path / "__init__.py"
    other.write_text(init.read_text().replace('__version__ = "', '__version__ = "0.0.0+other-'))
    cluster = make_cluster({"hostb": HostOptions(overlay={str(init): str(other)})})
    rc, report, elapsed = doctor(cluster, "-H", HOSTS, "-p", str(PORT))
    assert rc == 1 and elapsed < NO_TIMEOUT_HIT_S
    ((host, name, detail, fix),) = failed(report)
    assert (host, name) == ("hostb", "versions") and "hvdkit 0.0.0+other-" in detail
    assert "scripts/install.sh" in fix


@pytest.mark.parametrize("hosts_from", ["-H", "discovery script"])
@pytest.mark.parametrize("change, needles", [
    (lambda text: text.replace('__version__ = "', '__version__ = "0.0.0+other-'),
     ["hostb has hvdkit 0.0.0+other-", "run scripts/install.sh on hostb"]),
    (lambda text: text + '\nraise ImportError("half-installed")\n',
     ["hvdkit is not importable at", "on hostb (ImportError: half-installed)", "install it there"]),
])
def test_launch_refuses_a_host_without_this_hvdkit_and_starts_nothing(make_cluster, tmp_path, change, needles,
                                                                     hosts_from):
    init = ROOT / "hvdkit" / "__init__.py"
    other = tmp_path / "__init__.py"
    other.write_text(change(init.read_text()))
    cluster = make_cluster({"hostb": HostOptions(overlay={str(init): str(other)})})
    marker = tmp_path / "started"
    hosts = ["-H", HOSTS]
    if hosts_from == "discovery script":     # an elastic job: the hosts the script prints get the same check
        script = tmp_path / "discover.sh"
        script.write_text("#!/bin/sh\n" + "".join(f"echo {item}\n" for item in HOSTS.split(",")))
        script.chmod(0o755)
        hosts = ["--host-discovery-script", str(script)]
    argv = hvdkit_cmd("launch", "-np", "4", *hosts, "-p", str(PORT), "--",
                      sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    start = time.time()
    proc = cluster.run_on("hosta", argv, timeout=60, env=job_env())
    assert proc.returncode == 2 and time.time() - start < 30, proc.stdout[-2000:]
    errors = [line for line in proc.stdout.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stdout, proc.stdout[-2000:]
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    assert not marker.exists(), "no rank may start"
