"""Ring against parameter server across hosts: what was measured, next to what the cost model predicts.

The study (``make bench-scaling``: tests/multihost/scaling_study.py) runs
``hvdkit bench allreduce`` and ``hvdkit bench train`` on 2, 3, ... test hosts,
one process each, over links shaped by tc, and saves every bench result in
one ``scaling.json``. This module reads it back:

1. fits the model's network (:func:`hvdkit.ops.costmodel.fit_network`, what
   ``hvdkit plan --calibrate DIR --impl horovod-gloo`` does) to one ring's
   sweep on 2 hosts only: Horovod's Gloo ring by default, the one that ran at
   the link's rate (Open MPI's TCP allreduce did not: docs/BENCHMARKS.md);
2. predicts every other measured exchange with that one network: the ring
   for hvdkit (launch's controller) and Horovod's Gloo, the parameter server for ``ps``;
3. predicts each training step from its own measured local parts (input,
   forward and backward without communication, update) plus the predicted
   exchange, less what backward hides (the hidden share fitted on 2 hosts);
4. writes the table and the plot.

Example::

    study = json.load(open("docs/bench/scaling.json"))
    result = analyse(study)
    print(scaling_table(result))     # the picture: hvdkit.ops.plots.plot_scaling("scaling.png", result)
"""

from __future__ import annotations

from hvdkit.common.errors import UserError
from hvdkit.common.units import format_bytes
from hvdkit.ops.costmodel import Network, fit_network, parameter_server_s, ring_allreduce_s

TOLERANCE = 0.15            # the goal: every prediction within 15% of the measurement
RING = ("hvdkit", "horovod-gloo", "mpi4py-avg", "torch")
CALIBRATE_ON = "horovod-gloo"


def predicted_exchange_s(impl: str, nbytes: float, workers: int, net: Network) -> float:
    """The cost model's time to average ``nbytes`` over ``workers``: the server's formula for ps, else the ring's."""
    return parameter_server_s(nbytes, workers, net) if impl == "ps" else ring_allreduce_s(nbytes, workers, net)


def _runs(study: dict, kind: str) -> list[dict]:
    return [run for run in study.get("runs", []) if run["kind"] == kind]


def calibrate(study: dict, impl: str = CALIBRATE_ON) -> tuple[Network, int]:
    """The network fitted to ``impl``'s allreduce sweep on the fewest hosts it ran on (2), and that count."""
    sweeps = [(run["hosts"], r) for run in _runs(study, "allreduce") for r in run["data"]["rows"]
              if r["impl"] == impl and r["case"] == "sweep"]
    if not sweeps:
        raise UserError(f"the study has no {impl} allreduce sweep to calibrate on: rerun it with --ring "
                        f"including {impl}, or calibrate on one it ran")
    hosts = min(h for h, _ in sweeps)
    points = [(r["bytes"], r["median_s"]) for h, r in sweeps if h == hosts]
    if len(points) == 1:                  # one size (the smoke test): bandwidth alone, no latency term
        nbytes, seconds = points[0]
        return Network(bandwidth=2 * (hosts - 1) / hosts * nbytes / seconds, latency=0.0), hosts
    return fit_network(points, hosts), hosts


def analyse(study: dict, calibrate_on: str = CALIBRATE_ON) -> dict:
    """Every measured point with its prediction and error; the fitted network and hidden share."""
    net, fewest = calibrate(study, calibrate_on)
    exchanges = []
    for run in _runs(study, "allreduce"):
        for r in run["data"]["rows"]:
            predicted = predicted_exchange_s(r["impl"], r["bytes"], r["np"], net)
            exchanges.append({"impl": r["impl"], "hosts": run["hosts"], "workers": r["np"], "case": r["case"],
                              "bytes": r["bytes"], "measured_s": r["median_s"], "predicted_s": predicted,
                              "error": predicted / r["median_s"] - 1,
                              "calibration": r["impl"] == calibrate_on and r["case"] == "sweep"
                              and run["hosts"] == fewest})
    steps = _train_points(study, net)
    return {"link_mbit": study.get("link_mbit"), "machine": study.get("machine"), "calibrated_on": calibrate_on,
            "calibration_hosts": fewest,
            "network": {"bandwidth_Bps": net.bandwidth, "latency_s": net.latency},
            "exchanges": exchanges, "steps": steps, "tolerance": TOLERANCE,
            "within": sum(abs(p["error"]) <= TOLERANCE for p in exchanges + steps if not p.get("calibration")),
            "points": sum(1 for p in exchanges + steps if not p.get("calibration"))}


def _train_points(study: dict, net: Network) -> list[dict]:
    """Each measured training step with its prediction: measured local parts plus the predicted exchange.

    The ring's training runs are hvdkit's, over whatever ``hvdkit launch`` picks (Gloo across CPU hosts),
    while the network is fitted on the calibration ring: the hidden share fitted on the fewest hosts
    absorbs any gap between the two there, not on more hosts.
    """
    rows = [(run["hosts"], r) for run in _runs(study, "train") for r in run["data"]["rows"]]
    points = []
    # How much of the ring's exchange backward hides, as a share of its compute: fitted per model on the
    # fewest hosts (the cost model's ``overlap``); the parameter server hides nothing (it waits for backward).
    hidden = {}
    for model in {r["model"] for _, r in rows}:
        ring = sorted(((h, r) for h, r in rows if r["model"] == model and r["impl"] in RING), key=lambda x: x[0])
        if ring:
            h, r = ring[0]
            comm = ring_allreduce_s(r["grad_bytes"], r["np"], net)
            hidden[model] = min(max((comm - r["allreduce_ms"] / 1e3) / (r["compute_ms"] / 1e3), 0.0), 1.0)
    for hosts, r in rows:
        local = (r["step_ms"] - r["allreduce_ms"]) / 1e3          # input, compute, update: measured
        comm = predicted_exchange_s(r["impl"], r["grad_bytes"], r["np"], net)
        share = hidden.get(r["model"], 0.0) if r["impl"] in RING else 0.0
        predicted = local + max(0.0, comm - share * r["compute_ms"] / 1e3)
        points.append({"impl": r["impl"], "model": r["model"], "hosts": hosts, "workers": r["np"],
                       "grad_bytes": r["grad_bytes"], "measured_s": r["step_ms"] / 1e3, "predicted_s": predicted,
                       "local_s": local, "predicted_exchange_s": comm, "measured_exchange_s": r["allreduce_ms"] / 1e3,
                       "hidden_share": share, "error": predicted / (r["step_ms"] / 1e3) - 1,
                       "calibration": r["impl"] in RING and hosts == min(h for h, x in rows if x["model"] == r["model"]
                                                                          and x["impl"] in RING)})
    return points


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def scaling_table(result: dict) -> str:
    """The fitted network, then every exchange and step: measured, predicted, error; then the count within 15%."""
    net = result["network"]
    out = [f"network fitted to {result['calibrated_on']}'s {result['calibration_hosts']}-host ring sweep: "
           f"{net['bandwidth_Bps'] * 8 / 1e6:.0f} Mbit/s per link "
           f"and direction, {net['latency_s'] * 1e6:.0f} us per message"
           + (f" (links shaped to {result['link_mbit']:g} Mbit/s)" if result.get("link_mbit") else ""),
           "", "exchange of one step's gradients (median), measured vs predicted:",
           f"{'impl':13s} {'hosts':>5s} {'case':14s} {'size':>10s} {'measured ms':>12s} {'predicted ms':>13s} "
           f"{'error':>7s}"]
    for p in sorted(result["exchanges"], key=lambda p: (p["impl"], p["case"], p["bytes"], p["hosts"])):
        mark = "  (calibration)" if p["calibration"] else ("" if abs(p["error"]) <= TOLERANCE else "  > 15%")
        out.append(f"{p['impl']:13s} {p['hosts']:5d} {p['case']:14s} {format_bytes(p['bytes']):>10s} "
                   f"{_ms(p['measured_s']):>12s} {_ms(p['predicted_s']):>13s} {p['error']:+7.0%}{mark}")
    if result["steps"]:
        out += ["", "training step (median), measured vs predicted (local parts measured, exchange predicted):",
                f"{'impl':13s} {'model':9s} {'hosts':>5s} {'measured ms':>12s} {'predicted ms':>13s} {'error':>7s} "
                f"{'local ms':>9s} {'exchange ms':>12s}"]
        for p in sorted(result["steps"], key=lambda p: (p["model"], p["impl"], p["hosts"])):
            mark = "  (calibration)" if p["calibration"] else ("" if abs(p["error"]) <= TOLERANCE else "  > 15%")
            out.append(f"{p['impl']:13s} {p['model']:9s} {p['hosts']:5d} {_ms(p['measured_s']):>12s} "
                       f"{_ms(p['predicted_s']):>13s} {p['error']:+7.0%} {_ms(p['local_s']):>9s} "
                       f"{_ms(p['predicted_exchange_s']):>12s}{mark}")
    out += ["", f"{result['within']} of {result['points']} predicted points within {TOLERANCE:.0%} "
                "(calibration points not counted)"]
    return "\n".join(out)


