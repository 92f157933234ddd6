"""hvdkit doctor on clusters built with one fault each (own module: these hosts reuse the shared names)."""

import pytest

from tests.conftest import ROOT
from tests.multihost.test_multihost import HOSTS, doctor, failed
from tests.multihost.testhosts import PORT, HostOptions

pytestmark = pytest.mark.multihost


def test_doctor_names_an_interface_missing_on_one_host(make_cluster):
    cluster = make_cluster({"hostb": HostOptions(interface="ens5")})
    rc, report, elapsed = doctor(cluster, "-H", HOSTS, "-p", str(PORT), "--network-interface", "eth0")
    assert rc == 1 and elapsed < 30
    ((host, name, detail, _),) = failed(report)
    assert (host, name) == ("hostb", "network") and "eth0 is missing on hostb (hostb has ens5" in detail


def test_doctor_names_a_host_with_another_hvdkit_version(make_cluster, tmp_path):
    init = ROOT / "hvdkit" / "__init__.py"
    other = tmp_path / "__init__.py"
    other.write_text(init.read_text().replace('__version__ = "', '__version__ = "0.0.0+other-'))
    cluster = make_cluster({"hostb": HostOptions(overlay={str(init): str(other)})})
    rc, report, elapsed = doctor(cluster, "-H", HOSTS, "-p", str(PORT))
    assert rc == 1 and elapsed < 30
    ((host, name, detail, fix),) = failed(report)
    assert (host, name) == ("hostb", "versions") and "hvdkit 0.0.0+other-" in detail
    assert "scripts/install.sh" in fix
