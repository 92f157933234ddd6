"""Fit the cost model (:mod:`hvdkit.ops.costmodel`) to what ``hvdkit bench`` measured.

Example::

    net, np = calibrate_network("bench-results", "hvdkit")     # bandwidth and latency from allreduce.json
    row = train_compute("bench-results", "hvdkit", "resnet50")  # the measured step and its allreduce wait
"""

from __future__ import annotations

import json
import os

from hvdkit.common.errors import UserError
from hvdkit.ops.costmodel import Network, fit_network


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise UserError(f"{path} does not exist: run hvdkit bench first (--out sets the directory)") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path} is not a bench result ({exc}): rerun hvdkit bench") from None


def calibrate_network(directory: str, impl: str) -> tuple[Network, int]:
    data = _load(os.path.join(directory, "allreduce.json"))
    rows = [r for r in data.get("rows", []) if r["impl"] == impl and r["case"] == "sweep"]
    if not rows:
        have = sorted({r["impl"] for r in data.get("rows", [])})
        raise UserError(f"{directory}/allreduce.json has no {impl!r} sweep: pick --impl from "
                        f"{', '.join(have) or 'none'}")
    n = rows[0]["np"]
    return fit_network([(r["bytes"], r["median_s"]) for r in rows], n), n


def train_compute(directory: str, impl: str, model: str) -> dict | None:
    """The bench train row for ``impl``/``model`` at its largest process count (None if there is none)."""
    path = os.path.join(directory, "train.json")
    if not os.path.exists(path):
        return None
    rows = [r for r in _load(path).get("rows", []) if r["impl"] == impl and r["model"] == model]
    return max(rows, key=lambda r: r["np"]) if rows else None
