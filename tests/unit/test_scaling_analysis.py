"""hvdkit.bench.scaling: the study's measured points against the cost model fitted on 2 hosts."""

import pytest

from hvdkit.bench.scaling import analyse, scaling_table
from hvdkit.core.costmodel import Network, parameter_server_s, ring_allreduce_s
from hvdkit.core.errors import UserError

pytestmark = pytest.mark.unit
NET = Network(bandwidth=60e6, latency=200e-6)          # ~480 Mbit/s, as on the shaped test links
SIZES = (1 << 20, 4 << 20, 16 << 20)


def study(slow_mpi=1.0, ps_scale=1.0):
    runs = []
    for n in (2, 3, 4):
        rows = [{"impl": "horovod-gloo", "case": "sweep", "np": n, "bytes": k, "median_s": ring_allreduce_s(k, n, NET)}
                for k in SIZES]
        rows += [{"impl": "hvdkit", "case": "sweep", "np": n, "bytes": k,
                  "median_s": slow_mpi * ring_allreduce_s(k, n, NET)} for k in SIZES]
        runs.append({"hosts": n, "kind": "allreduce", "data": {"rows": rows}})
        runs.append({"hosts": n, "kind": "allreduce", "data": {"rows": [
            {"impl": "ps", "case": "sweep", "np": n, "bytes": k, "median_s": ps_scale * parameter_server_s(k, n, NET)}
            for k in SIZES]}})
        grad = 4 << 20
        local, compute = 0.1, 0.08
        exposed = max(ring_allreduce_s(grad, n, NET) - 0.5 * compute, 0)
        runs.append({"hosts": n, "kind": "train", "data": {"rows": [
            # the ring hides half of compute's worth of its exchange; the server hides nothing
            {"impl": "hvdkit", "model": "mnist", "np": n, "grad_bytes": grad, "compute_ms": compute * 1e3,
             "allreduce_ms": exposed * 1e3, "step_ms": (local + exposed) * 1e3},
            {"impl": "ps", "model": "mnist", "np": n, "grad_bytes": grad, "compute_ms": compute * 1e3,
             "allreduce_ms": parameter_server_s(grad, n, NET) * 1e3,
             "step_ms": (local + parameter_server_s(grad, n, NET)) * 1e3}]}})
    return {"link_mbit": 500, "runs": runs}


def test_a_study_that_follows_the_model_is_predicted_exactly():
    result = analyse(study())
    assert result["network"]["bandwidth_Bps"] == pytest.approx(NET.bandwidth, rel=1e-6)
    assert result["network"]["latency_s"] == pytest.approx(NET.latency, rel=1e-6)
    assert all(abs(p["error"]) < 1e-6 for p in result["exchanges"] + result["steps"])
    # Calibration points (Gloo's 2-host sweep, the ring's 2-host step) are marked and not counted.
    calibration = [p for p in result["exchanges"] + result["steps"] if p["calibration"]]
    assert {(p["impl"], p["hosts"]) for p in calibration} == {("horovod-gloo", 2), ("hvdkit", 2)}
    assert len(calibration) == len(SIZES) + 1 and result["calibration_hosts"] == 2
    assert result["within"] == result["points"] == len(result["exchanges"]) + len(result["steps"]) - len(calibration)
    assert all(p["hidden_share"] == pytest.approx(0.5) for p in result["steps"] if p["impl"] == "hvdkit")
    table = scaling_table(result)
    assert "480 Mbit/s per link" in table and "> 15%" not in table


def test_points_off_the_model_are_flagged():
    result = analyse(study(slow_mpi=2.0, ps_scale=1.1))
    off = {(p["impl"], p["hosts"]) for p in result["exchanges"] if abs(p["error"]) > 0.15}
    assert off == {("hvdkit", n) for n in (2, 3, 4)}            # the server 10% off stays within 15%
    assert "> 15%" in scaling_table(result)


def test_without_a_2_host_ring_the_fit_moves_to_3_hosts_and_says_so():
    runs = [r for r in study()["runs"] if not (r["hosts"] == 2 and r["kind"] == "allreduce")]
    result = analyse({"runs": runs})
    assert result["calibration_hosts"] == 3 and "3-host ring sweep" in scaling_table(result)
    assert {p["hosts"] for p in result["exchanges"] if p["calibration"]} == {3}


def test_no_ring_to_calibrate_on_is_one_line():
    with pytest.raises(UserError, match="no horovod-gloo allreduce sweep to calibrate on"):
        analyse({"runs": [r for r in study()["runs"] if r["kind"] == "train"]})
