"""Turn benchmark payloads into rows, a text table, CSV, JSON and PNG plots.

Bandwidth follows the NCCL-tests convention: algbw = bytes / time and
busbw = algbw x 2(N-1)/N, the rate each link runs at in a ring, which is
comparable across process counts.
"""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
import time
from collections.abc import Callable

from hvdkit.bench.catalog import implementations
from hvdkit.common.console import text_table
from hvdkit.common.errors import UserError
from hvdkit.common.files import atomic_write, writable_free_bytes
from hvdkit.common.units import format_bytes


def bus_factor(n: int) -> float:
    return 2 * (n - 1) / n if n > 1 else 1.0


def allreduce_rows(payloads: list[dict]) -> list[dict]:
    """One row per (implementation, case, size) over all rounds.

    Each launch (round) reports several timed repeats; a round's value is
    their median, and the row's ``median_s`` is the median over rounds, so
    neither a noisy second inside a run nor a noisy run moves it much.
    """
    groups: dict[tuple, list] = {}
    meta = {}
    for payload in payloads:
        for r in payload["rows"]:
            key = (payload["impl"], r["case"], r["bytes"])
            groups.setdefault(key, []).append(r["times_s"])
            meta[key] = (payload, r)
    rows = []
    for key, runs in groups.items():
        payload, r = meta[key]
        n = payload["np"]
        per_round = [statistics.median(times) for times in runs]
        med = statistics.median(per_round)
        rows.append({"impl": payload["impl"], "label": payload["label"], "controller": payload["controller"],
                     "np": n, "case": r["case"], "bytes": r["bytes"], "tensors": r["tensors"],
                     "median_s": med, "min_s": min(min(t) for t in runs), "max_s": max(max(t) for t in runs),
                     "rounds": len(runs), "repeats": len(runs[0]),
                     "round_medians_s": per_round, "algbw_GBps": r["bytes"] / med / 1e9,
                     "busbw_GBps": r["bytes"] / med / 1e9 * bus_factor(n)})
    return rows


REFERENCES = tuple(i.name for i in implementations("allreduce") if i.reference)


def allreduce_table(rows: list[dict], references: tuple[str, ...] = REFERENCES, subject: str = "hvdkit") -> str:
    """Bus bandwidth per size and implementation, plus subject/reference for each reference that ran.

    Two references by default: raw MPI's sum, and that sum followed by one
    in-place scale, the least an averaging allreduce must do. Then the
    ResNet-50 fusion lines.
    """
    sweep = [r for r in rows if r["case"] == "sweep"]
    impls = list(dict.fromkeys(r["impl"] for r in sweep))
    by = {(r["impl"], r["bytes"]): r for r in sweep}
    refs = [ref for ref in references if ref in impls and subject in impls]
    header = ["size"] + impls + [f"{subject}/{ref}" for ref in refs]
    lines = [header]
    for size in sorted({r["bytes"] for r in sweep}):
        line = [format_bytes(size)] + [f"{by[(i, size)]['busbw_GBps']:.2f}" if (i, size) in by else "-" for i in impls]
        for ref in refs:
            have = (subject, size) in by and (ref, size) in by
            line.append(f"{by[(subject, size)]['busbw_GBps'] / by[(ref, size)]['busbw_GBps']:.0%}" if have else "-")
        lines.append(line)
    out = ["bus bandwidth, GB/s (median over rounds of the median of repeats)", text_table(lines)]
    many = {r["impl"]: r for r in rows if r["case"] == "resnet50-many"}
    one = {r["impl"]: r for r in rows if r["case"] == "resnet50-one"}
    if many:
        out.append("")
        out.append("ResNet-50 gradients: 161 tensors at once vs one tensor of the same bytes")
        for impl in many:
            if impl in one:
                m, o = many[impl], one[impl]
                out.append(f"  {impl:13s} {m['median_s'] * 1e3:8.1f} ms vs {o['median_s'] * 1e3:8.1f} ms  "
                           f"({m['median_s'] / o['median_s']:.2f}x)")
    return "\n".join(out)


RESULTS_BYTES = 1 << 20      # a bench's JSON, CSV, text and PNG: tens to hundreds of KiB


def check_results_dir(out: str) -> None:
    """Before any launch: stop with one line if ``out`` cannot take a bench's results (about 1 MiB)."""
    try:
        free = writable_free_bytes(out)
    except OSError as exc:
        raise UserError(f"cannot write bench results to {out!r}: {exc.strerror or exc} (errno {exc.errno}): "
                        "choose another --out directory") from exc
    if free < RESULTS_BYTES:
        raise UserError(f"--out {out!r} has {format_bytes(free)} free, and a bench's results need about "
                        f"{format_bytes(RESULTS_BYTES)}: free space there or choose another --out directory")


def write_file(path: str, data: str | bytes) -> None:
    """Write a result atomically: on a full disk or a read-only directory the run stops with one line
    (:class:`~hvdkit.common.files.WriteError`, a UserError) and the previous file stays whole."""
    raw = data.encode() if isinstance(data, str) else data
    atomic_write(path, lambda f: f.write(raw), what="bench result")


def write_csv(path: str, rows: list[dict]) -> None:
    if not rows:
        return
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_file(path, text.getvalue())


def write_json(path: str, data: dict) -> None:
    write_file(path, json.dumps(data, indent=1) + "\n")


def machine_line(payload: dict) -> str:
    m = payload.get("machine", {})
    gpu = m.get("gpu") or "no GPU"
    return (f"{m.get('host', '?')}: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, "
            f"{m.get('memory_gib', '?')} GiB, {gpu}")



def results_data(kind: str, payloads: list[dict], started: float, skipped: dict, failures: list[str],
                 rows: list[dict], **fields) -> dict:
    """The JSON a bench writes: what ran, on which machine, when, what was skipped or failed, and the rows."""
    return {"kind": kind, **fields, "machine": payloads[0]["machine"] if payloads else None,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)), "skipped": skipped,
            "failures": failures, "launches": [p["launch"] for p in payloads], "rows": rows}


def write_results(out: str, data: dict, title: str, table: str, plot: Callable[[str, list, str], None]) -> None:
    """``<kind>.json``, ``.csv``, ``.txt`` (title and table) and ``.png`` (when there are rows) under ``out``."""
    kind, rows = data["kind"], data["rows"]
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, f"{kind}.json"), data)
    write_csv(os.path.join(out, f"{kind}.csv"), rows)
    write_file(os.path.join(out, f"{kind}.txt"), f"{title}\n{table}\n")
    if rows:
        plot(os.path.join(out, f"{kind}.png"), rows, title)


