"""The cost model's formulas and the calibration fit."""

import pytest

from hvdkit.common.errors import UserError
from hvdkit.common.units import parse_count
from hvdkit.ops.costmodel import Network, Workload, fit_network, parameter_server_s, predict, ring_allreduce_s

pytestmark = pytest.mark.unit
NET = Network(bandwidth=10e9, latency=5e-6)


def test_ring_and_server_against_hand_calculations():
    # 100 MB of gradients on 10 GB/s links with 5 us per message, worked by hand:
    # 2 workers: each sends and receives half the buffer twice, 2 x 50 MB / 10 GB/s = 10 ms, 2 messages: 10.010 ms.
    assert ring_allreduce_s(100e6, 2, NET) == pytest.approx(0.010010)
    # 16 workers: 30 steps of 100/16 MB (6.25 MB, 0.625 ms each) = 18.75 ms, plus 30 x 5 us = 18.90 ms.
    assert ring_allreduce_s(100e6, 16, NET) == pytest.approx(0.018900)
    assert ring_allreduce_s(100e6, 1, NET) == 0
    # One server: 16 workers push and pull 100 MB each through its link, 3.2 GB / 10 GB/s = 320 ms, +10 us.
    assert parameter_server_s(100e6, 16, NET) == pytest.approx(0.320010)
    # The ring's cost levels off; the server's grows with N (512 workers: 10.24 s against 20 ms).
    assert parameter_server_s(100e6, 512, NET) / ring_allreduce_s(100e6, 512, NET) > 200


def test_the_ring_matches_a_measured_ring():
    # docs/bench/scaling.txt, torch's Gloo ring on links shaped to 500 Mbit/s, 474 Mbit/s fitted per link:
    # 3 hosts 16 MiB measured 373.7 ms, 4 hosts 64 MiB 1687.4 ms.
    link = Network(bandwidth=474e6 / 8, latency=0)
    assert ring_allreduce_s(16 << 20, 3, link) == pytest.approx(0.3737, rel=0.03)
    assert ring_allreduce_s(64 << 20, 4, link) == pytest.approx(1.6874, rel=0.03)


def test_overlap_hides_communication_up_to_the_compute_time():
    # A 100 ms step whose 10.01 ms exchange may hide under half the compute (50 ms): the step stays 100 ms.
    p = predict(Workload(grad_bytes=100e6, compute_s=0.1, overlap=0.5), NET, 2)
    assert p.ring_step_s == pytest.approx(0.1) and p.ring_efficiency == pytest.approx(1.0)
    # With no overlap it adds all of it: 110.01 ms.
    p = predict(Workload(grad_bytes=100e6, compute_s=0.1), NET, 2)
    assert p.ring_step_s == pytest.approx(0.110010)


def test_fit_recovers_the_shaped_links_bandwidth():
    # The study's 2-host Gloo sweep (docs/bench/scaling.txt): 1, 4, 16, 64 MiB in 16.3, 69.8, 280.5, 1133.3 ms,
    # on links tc shaped to 500 Mbit/s. The fit must land near the shaping (TCP and framing take a few %).
    fitted = fit_network([(1 << 20, 0.0163), (4 << 20, 0.0698), (16 << 20, 0.2805), (64 << 20, 1.1333)], 2)
    assert 0.90 * 500e6 / 8 < fitted.bandwidth < 500e6 / 8
    assert 0 <= fitted.latency < 1e-3


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
