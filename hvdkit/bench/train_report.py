"""Rows, table and plot for ``hvdkit bench train``."""

from __future__ import annotations

import math
import statistics

from hvdkit.common.console import text_table

PHASES = ("input", "compute", "allreduce", "update")


def _medians(p: dict) -> dict:
    med = {k: statistics.median(v) for k, v in p["phases_s"].items()}
    if not math.isnan(p.get("local_backward_s", math.nan)):
        # hvdkit's and DDP's allreduce end inside backward: split it out with the time of a backward
        # without communication (measured only for them; saved rows from before hold it for DDP only).
        med["allreduce"] = max(med["compute"] - p["local_backward_s"], 0.0)
        med["compute"] = min(p["local_backward_s"], med["compute"])
    return med


def train_rows(payloads: list[dict]) -> list[dict]:
    """One row per (model, implementation, np): medians over repeated runs of each run's median step."""
    groups: dict[tuple, list[dict]] = {}
    for p in payloads:
        groups.setdefault((p["model"], p["impl"], p["np"]), []).append(p)
    rows = []
    for (model, impl, n), runs in groups.items():
        per_run = [_medians(p) for p in runs]
        med = {k: statistics.median(m[k] for m in per_run) for k in per_run[0]}
        p = runs[0]
        step = med["step"]
        row = {"model": model, "impl": impl, "np": n, "controller": p["controller"], "repeats": len(runs),
               "batch_size": p["batch_size"], "params": p["params"], "grad_bytes": p["grad_bytes"],
               "step_ms": step * 1e3, "samples_per_s": n * p["batch_size"] / step,
               "step_ms_runs": [m["step"] * 1e3 for m in per_run],
               "allreduce_estimated": not math.isnan(p.get("local_backward_s", math.nan)), "threads": p.get("threads")}
        for phase in PHASES:
            row[f"{phase}_ms"] = med[phase] * 1e3
            row[f"{phase}_share"] = med[phase] / step if step else 0.0
        rows.append(row)
    for row in rows:
        base = min((r for r in rows if r["model"] == row["model"] and r["impl"] == row["impl"]),
                   key=lambda r: r["np"])
        per_proc = row["samples_per_s"] / row["np"]
        row["scaling_efficiency"] = per_proc / (base["samples_per_s"] / base["np"])
    return rows


def train_table(rows: list[dict]) -> str:
    header = ["model", "np", "impl", "samples/s", "step ms", "input", "compute", "allreduce", "update", "scaling",
              "vs horovod"]
    lines = [header]
    for r in sorted(rows, key=lambda r: (r["model"], r["np"], r["impl"])):
        ref = next((x for x in rows
                    if x["model"] == r["model"] and x["np"] == r["np"] and x["impl"] == "horovod"), None)
        lines.append([r["model"], str(r["np"]), r["impl"], f"{r['samples_per_s']:.1f}", f"{r['step_ms']:.1f}",
                      *[f"{r[f'{ph}_share']:.0%}" + ("*" if ph == "allreduce" and r["allreduce_estimated"] else "")
                        for ph in PHASES],
                      f"{r['scaling_efficiency']:.0%}",
                      f"{r['samples_per_s'] / ref['samples_per_s']:.3f}" if ref else "-"])
    out = ["throughput (median step) and where the step's time goes", text_table(lines)]
    out.append("* averaged inside backward (hvdkit, DDP): the share is backward minus a backward without "
               "communication.")
    return "\n".join(out)


