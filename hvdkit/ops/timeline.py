"""Read Horovod's timeline and say which rank keeps the others waiting, and where the collective time goes.

Horovod's rank 0 coordinator writes the timeline (``HOROVOD_TIMELINE=FILE``,
horovodrun's ``--timeline-filename``; ``hvdkit launch --timeline FILE``) as
Chrome trace JSON: one trace "process" per tensor (named ``allreduce.fc.bias``),
and in it, for each collective, a ``NEGOTIATE_ALLREDUCE`` span holding one
zero-length event per rank, named by the rank, at the moment that rank said the
tensor was ready; then an ``ALLREDUCE`` span with its sub-activities
(``MEMCPY_IN_FUSION_BUFFER``, ``GLOO_ALLREDUCE`` or ``MPI_ALLREDUCE``, ...),
whose end carries the tensor's dtype and shape. Times are microseconds.

Horovod leaves the JSON array open (it closes it only at a clean shutdown, and
not always then), and a killed job may stop mid-event, so the reader takes
events one by one and keeps those that are whole.

The per-rank markers appear only when the coordinator negotiates a tensor
in full; a tensor answered from Horovod's response cache (every step after the
first, by default) is negotiated without them. ``hvdkit launch --timeline`` therefore
also passes ``--cache-capacity 0``.

Example::

    report = analyze(read_timeline("timeline.json"))
    print(format_report(report))        # late ranks, waiting against reducing, the heaviest tensors
    report.latest_rank                  # the rank the others wait for most, or None
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field

from hvdkit.common.errors import UserError
from hvdkit.common.units import format_bytes

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
               "int32": 4, "int64": 8, "bool": 1}


@dataclass(frozen=True)
class Negotiation:
    """One negotiation of one tensor: when each rank reported it ready (microseconds)."""

    tensor: str
    start_us: float
    end_us: float
    ready_us: dict[int, float]


@dataclass(frozen=True)
class Operation:
    """One collective on one tensor after its negotiation: its span and its sub-activities' durations."""

    tensor: str
    kind: str                      # ALLREDUCE, ALLGATHER, BROADCAST, ...
    start_us: float
    end_us: float
    activities: tuple[tuple[str, float, float], ...] = ()   # (name, start, end)
    nbytes: int | None = None


@dataclass(frozen=True)
class Timeline:
    negotiations: tuple[Negotiation, ...]
    operations: tuple[Operation, ...]
    complete: bool                 # the JSON array was closed (False: Horovod was still writing, or was killed)


def parse_timeline(text: str) -> Timeline:
    """A :class:`Timeline` from the text of Horovod's timeline file, closed, open or cut short."""
    start = text.find("[")
    if start < 0:
        raise UserError("this is not a Horovod timeline (no '[' opening its JSON array): record one with "
                        "hvdkit launch --timeline FILE or HOROVOD_TIMELINE=FILE")
    events, complete = _events(text, start + 1)
    names: dict[int, str] = {}
    open_spans: dict[int, list[dict]] = {}     # pid -> stack of {"name", "start", "ready", "activities"}
    negotiations, operations = [], []
    for e in events:
        pid, ph = e.get("pid"), e.get("ph")
        if ph == "M" and e.get("name") == "process_name" and "name" in e.get("args", {}):
            names[pid] = e["args"]["name"]
            continue
        stack = open_spans.setdefault(pid, [])
        if ph == "B":
            stack.append({"name": e.get("name", ""), "start": e["ts"], "ready": {}, "activities": []})
        elif ph == "X" and stack and str(e.get("name", "")).isdigit():
            stack[-1]["ready"][int(e["name"])] = e["ts"]
        elif ph == "E" and stack:
            span = stack.pop()
            tensor = names.get(pid, f"tensor {pid}")
            if stack:                              # a sub-activity of the collective
                stack[-1]["activities"].append((span["name"], span["start"], e["ts"]))
            elif span["name"].startswith("NEGOTIATE_"):
                negotiations.append(Negotiation(tensor, span["start"], e["ts"], span["ready"]))
            else:
                operations.append(Operation(tensor, span["name"], span["start"], e["ts"],
                                            tuple(span["activities"]), _nbytes(e.get("args", {}))))
    return Timeline(tuple(negotiations), tuple(operations), complete)


def read_timeline(path: str) -> Timeline:
    """:func:`parse_timeline` of the file at ``path``; UserError naming the fix when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as exc:
        raise UserError(f"cannot read the timeline {path!r} ({exc.strerror}): give the file that "
                        "hvdkit launch --timeline (or HOROVOD_TIMELINE) wrote, on rank 0's host") from exc
    return parse_timeline(text)


def _events(text: str, pos: int) -> tuple[list[dict], bool]:
    """The whole JSON objects of the array starting at ``pos``, and whether the array was closed."""
    decoder, events = json.JSONDecoder(), []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            return events, False
        if text[pos] == "]":
            return events, True
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except ValueError:                 # cut off mid-event: keep what came before
            return events, False
        if isinstance(obj, dict):
            events.append(obj)


def _nbytes(args: dict) -> int | None:
    try:
        dims = [int(d) for d in args["shape"].strip("[]").split(",") if d.strip()]
        count = 1
        for d in dims:
            count *= d
        return count * DTYPE_BYTES[args["dtype"]]
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True)
class RankStats:
    rank: int
    negotiations: int              # full negotiations this rank was seen in
    late_median_ms: float          # after the first rank ready for the same tensor
    late_total_ms: float           # wall time some rank was ready and this one not yet
    waited_ms: float               # wall time this rank was ready and some other rank not yet


@dataclass(frozen=True)
class TensorStats:
    tensor: str
    count: int
    op_ms: float                   # in the collective itself
    negotiate_ms: float            # from the first rank's request to the coordinator's answer
    nbytes: int | None


@dataclass(frozen=True)
class TimelineReport:
    ranks: tuple[RankStats, ...]
    tensors: tuple[TensorStats, ...]           # heaviest (most time in the collective) first
    reducing_ms: float                         # wall time inside collectives (fused tensors counted once)
    activities_ms: dict[str, float]            # the same per sub-activity
    span_ms: float                             # first event to last
    negotiations: int
    cached_negotiations: int                   # without per-rank markers (the response cache answered)
    complete: bool
    latest_rank: int | None = None             # the rank latest by its median lateness
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict:
        return asdict(self)


def analyze(timeline: Timeline, top: int = 10) -> TimelineReport:
    """Per rank: how late it reports tensors ready and how long it waits; per tensor: where the time goes."""
    late: dict[int, list[float]] = {}
    behind: dict[int, list[tuple[float, float]]] = {}     # (first rank ready, this rank ready)
    ahead: dict[int, list[tuple[float, float]]] = {}      # (this rank ready, last rank ready)
    cached = 0
    for n in timeline.negotiations:
        if len(n.ready_us) < 2:
            cached += 1
            continue
        first, last = min(n.ready_us.values()), max(n.ready_us.values())
        for rank, ts in n.ready_us.items():
            late.setdefault(rank, []).append((ts - first) / 1e3)
            behind.setdefault(rank, []).append((first, ts))
            ahead.setdefault(rank, []).append((ts, last))
    # Totals are wall time (interval unions): a step's tensors are negotiated side by side, and the
    # same 40 ms of one rank's lateness would otherwise count once per tensor.
    ranks = tuple(RankStats(r, len(late[r]), statistics.median(late[r]), _union_ms(behind[r]), _union_ms(ahead[r]))
                  for r in sorted(late))
    # By the median, not the total: one late start (rank 0 importing for half a second before the first
    # allgather, measured) outweighs 40 ms on every step of a short run.
    latest = max(ranks, key=lambda s: (s.late_median_ms, s.late_total_ms)) if ranks else None
    latest = latest.rank if latest is not None and latest.late_median_ms > 0 else None
    tensors = _tensor_stats(timeline)
    stamps = [t for o in timeline.operations for t in (o.start_us, o.end_us)] + [
        t for n in timeline.negotiations for t in (n.start_us, n.end_us)]
    activities: dict[str, list[tuple[float, float]]] = {}
    for o in timeline.operations:
        for name, start, end in o.activities:
            activities.setdefault(name, []).append((start, end))
    notes = []
    if not timeline.complete:
        notes.append("the timeline is not closed (the job was running or was killed): read up to its last "
                     "whole event")
    if cached and not ranks:
        notes.append("no negotiation carries per-rank markers: Horovod's response cache answered them all; "
                     "record with hvdkit launch --timeline (it passes --cache-capacity 0) or "
                     "HOROVOD_CACHE_CAPACITY=0")
    return TimelineReport(
        ranks=ranks, tensors=tuple(sorted(tensors, key=lambda t: -t.op_ms)[:top]),
        reducing_ms=_union_ms([(o.start_us, o.end_us) for o in timeline.operations]),
        activities_ms={k: _union_ms(v) for k, v in sorted(activities.items())},
        span_ms=(max(stamps) - min(stamps)) / 1e3 if stamps else 0.0,
        negotiations=len(timeline.negotiations), cached_negotiations=cached, complete=timeline.complete,
        latest_rank=latest, notes=tuple(notes))


def _tensor_stats(timeline: Timeline) -> list[TensorStats]:
    ops: dict[str, list[Operation]] = {}
    for o in timeline.operations:
        ops.setdefault(o.tensor, []).append(o)
    negotiate: dict[str, float] = {}
    for n in timeline.negotiations:
        negotiate[n.tensor] = negotiate.get(n.tensor, 0.0) + (n.end_us - n.start_us) / 1e3
    return [TensorStats(name, len(os_), sum(o.end_us - o.start_us for o in os_) / 1e3, negotiate.get(name, 0.0),
                        next((o.nbytes for o in os_ if o.nbytes is not None), None)) for name, os_ in ops.items()]


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of (start, end) intervals, in ms: fused tensors share one span."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e3


def format_report(report: TimelineReport) -> str:
    """The report as text: a row per rank, the time in collectives, the heaviest tensors, then notes."""
    from hvdkit.common.console import text_table

    out = [f"{report.negotiations} negotiations over {report.span_ms / 1e3:.2f} s "
           f"({report.cached_negotiations} answered from Horovod's cache, without per-rank times)"]
    if report.ranks:
        rows = [["rank", "negotiations", "late median ms", "late total ms", "waited ms"]]
        rows += [[str(s.rank), str(s.negotiations), f"{s.late_median_ms:.2f}", f"{s.late_total_ms:.1f}",
                  f"{s.waited_ms:.1f}"] for s in report.ranks]
        out += ["how late each rank reports a tensor ready, after the first rank ready for it:", text_table(rows)]
    if report.latest_rank is not None:
        s = next(s for s in report.ranks if s.rank == report.latest_rank)
        out.append(f"rank {s.rank} is the latest: {s.late_median_ms:.2f} ms after the first rank for the median "
                   f"tensor; the others waited {s.late_total_ms:.1f} ms for it in all")
    waiting = max((s.waited_ms for s in report.ranks), default=0.0)
    out.append(f"in collectives: {report.reducing_ms:.1f} ms reducing against up to {waiting:.1f} ms waiting "
               "for the last rank (" + ", ".join(f"{k} {v:.1f} ms" for k, v in report.activities_ms.items()) + ")")
    if report.tensors:
        rows = [["tensor", "count", "size", "collective ms", "negotiate ms"]]
        rows += [[t.tensor, str(t.count), format_bytes(t.nbytes) if t.nbytes is not None else "-", f"{t.op_ms:.1f}",
                  f"{t.negotiate_ms:.1f}"] for t in report.tensors]
        out += ["heaviest tensors:", text_table(rows, align="l")]
    out += [f"note: {n}" for n in report.notes]
    return "\n".join(out)
