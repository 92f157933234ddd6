"""The scaling study's smoke run (issue 26): 2 test hosts plus a server host, links shaped to 200 Mbit/s,
one size, Horovod's ring against the parameter server. The full study is `make bench-scaling`."""

import json

import pytest

from tests.multihost.conftest import require_root
from tests.multihost.scaling_study import main

pytestmark = pytest.mark.multihost
MBIT = 200
SIZE = 8 << 20


@pytest.mark.timeout(600)        # 41-58 s measured; each launch is bounded at 240 s below, inside this
def test_ring_and_parameter_server_on_shaped_links(tmp_path):
    require_root()
    rc = main(["--hosts", "2", "--link-mbit", str(MBIT), "--sizes", "8M", "--ring", "hvdkit,horovod-gloo",
               "--models", "",
               "--repeats", "2", "--timeout", "240", "--out", str(tmp_path)])
    study = json.loads((tmp_path / "scaling.json").read_text())
    assert rc == 0 and not study["failures"], study["failures"]
    assert study["qdisc"].count(f"rate {MBIT}Mbit") == 2                      # both ends of the server's link
    ring_run, ps_run = study["runs"]
    assert ring_run["data"]["hosts"] == ["worker1", "worker2"]
    assert ps_run["data"]["hosts"] == ["server", "worker1", "worker2"]
    rows = {r["impl"]: r for run in study["runs"] for r in run["data"]["rows"]}
    assert set(rows) == {"hvdkit", "horovod-gloo", "ps"}
    assert all(r["np"] == 2 and r["bytes"] == SIZE for r in rows.values())   # workers, not processes
    # The links set the pace: nothing beats its bytes over the shaped link. A ring moves K each way per
    # worker (N = 2). The server's link carries N*K = 2K in and 2K out per exchange; the cost model adds
    # them (4K, 4x Gloo's ring), but the floor is 2K: a worker answered first sends its next buffer while
    # the server still answers the other, so the two directions can overlap (CI, with the image build on
    # the same cores, measured the server at 0.93 x 4K/link, which a 4K floor refused). The upper bounds
    # are loose for the same reason (measured alone at 200 Mbit/s, 4 and 16 MiB: Gloo at 1.04-1.08x the
    # link's time, the server at 3.8-3.9x Gloo; Open MPI's TCP allreduce is slower, so hvdkit's row is
    # bounded below only).
    link = MBIT * 1e6 / 8
    for impl, factor in (("hvdkit", 1), ("horovod-gloo", 1), ("ps", 2)):
        assert rows[impl]["median_s"] >= 0.95 * factor * SIZE / link, (impl, rows[impl]["median_s"])
    assert rows["horovod-gloo"]["median_s"] <= 2 * SIZE / link, rows["horovod-gloo"]["median_s"]
    # The server's point: several times the ring's time (3.8-3.9x measured alone; its floor, 2K, is 2x Gloo's
    # unloaded K). 1.8 leaves room for CI slowing Gloo by half while the server stays near its floor.
    assert rows["ps"]["median_s"] / rows["horovod-gloo"]["median_s"] > 1.8
    table = (tmp_path / "scaling.txt").read_text()
    assert "measured vs predicted" in table and "(calibration)" in table
    predicted = json.loads((tmp_path / "scaling-predicted.json").read_text())
    assert {p["impl"] for p in predicted["exchanges"]} == {"hvdkit", "horovod-gloo", "ps"}
    assert (tmp_path / "scaling.png").stat().st_size > 10_000
