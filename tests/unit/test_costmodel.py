"""The cost model's formulas and the calibration fit."""

import pytest

from hvdkit.common.errors import UserError
from hvdkit.common.units import parse_count
from hvdkit.ops.costmodel import Network, Workload, fit_network, parameter_server_s, predict, ring_allreduce_s

pytestmark = pytest.mark.unit
NET = Network(bandwidth=10e9, latency=5e-6)


def test_ring_moves_2_n_minus_1_over_n_of_the_bytes():
    k = 100e6
    assert ring_allreduce_s(k, 1, NET) == 0
    assert ring_allreduce_s(k, 2, NET) == pytest.approx(1 * k / 10e9 + 2 * 5e-6)
    assert ring_allreduce_s(k, 16, NET) == pytest.approx(2 * 15 / 16 * k / 10e9 + 30 * 5e-6)


def test_parameter_server_link_carries_every_worker():
    k = 100e6
    assert parameter_server_s(k, 16, NET) == pytest.approx(32 * k / 10e9 + 2 * 5e-6)
    # The ring's cost levels off; the server's grows with N.
    assert parameter_server_s(k, 512, NET) / ring_allreduce_s(k, 512, NET) > 200


def test_overlap_hides_communication_up_to_the_compute_time():
    work = Workload(grad_bytes=100e6, compute_s=0.1, overlap=0.5)
    p = predict(work, NET, 2)   # ring 10 ms, of which up to 50 ms can hide
    assert p.ring_step_s == pytest.approx(0.1) and p.ring_efficiency == pytest.approx(1.0)
    p = predict(Workload(grad_bytes=100e6, compute_s=0.1), NET, 2)
    assert p.ring_step_s == pytest.approx(0.1 + 0.01 + 2 * 5e-6)


def test_fit_recovers_bandwidth_and_latency():
    true = Network(bandwidth=3e9, latency=40e-6)
    points = [(k, ring_allreduce_s(k, 2, true)) for k in (4096, 65536, 1 << 20, 16 << 20, 256 << 20)]
    fitted = fit_network(points, 2)
    assert fitted.bandwidth == pytest.approx(3e9, rel=1e-6)
    assert fitted.latency == pytest.approx(40e-6, rel=1e-6)


@pytest.mark.parametrize("points, workers, fix", [
    ([(1, 1.0), (2, 2.0)], 1, "-np 2"),
    ([(1 << 20, 1.0)], 2, "--sizes"),
    ([(1 << 20, 2.0), (1 << 30, 1.0)], 2, "larger --sizes"),
])
def test_fit_refuses_what_it_cannot_fit(points, workers, fix):
    with pytest.raises(UserError, match=fix):
        fit_network(points, workers)


def test_bad_inputs_name_the_fix():
    with pytest.raises(UserError, match="--bandwidth"):
        Network(bandwidth=0, latency=0)
    with pytest.raises(UserError, match="0..1"):
        Workload(grad_bytes=1, compute_s=1, overlap=2)


@pytest.mark.parametrize("make, fix", [
    (lambda: Network(bandwidth=float("nan"), latency=0), "--bandwidth"),
    (lambda: Network(bandwidth=float("inf"), latency=0), "--bandwidth"),
    (lambda: Network(bandwidth=1e9, latency=float("nan")), "--latency"),
    (lambda: Workload(grad_bytes=1, compute_s=float("nan")), "--compute-ms"),
    (lambda: Workload(grad_bytes=float("inf"), compute_s=1), "--params"),
    (lambda: parse_count("0"), "parameter count '0' is not above 0"),
    (lambda: parse_count("nan"), "parameter count 'nan' is not"),
])
def test_nan_inf_and_zero_are_refused_not_replaced(make, fix):
    """Issue 35: --params 0 became ResNet-50's count and nan went through to the table."""
    with pytest.raises(UserError, match=fix):
        make()
