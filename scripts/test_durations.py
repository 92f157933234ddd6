"""Every test's time from pytest's JUnit XML: the seconds per tier and the slowest tests (.ci/run prints this).

    python3 scripts/test_durations.py build/junit-test.xml                  # the table
    python3 scripts/test_durations.py build/junit-test.xml --slowest 40 --json

A test's time is pytest's for the whole test (setup, call and teardown, so a
fixture that starts test hosts counts where it runs). Its CPU seconds, where
tests/cpu_seconds.py recorded them (the ``cpu_s`` property: this process, the
jobs it ran and its job-pool scenarios), are what it costs: ``make test``'s two lanes share 2 cores, so a
test's wall time there grows with whatever the other lane runs. The tier is the test's
directory under tests/ (unit, adapters, cli, multiproc, multihost, container);
the docs' code blocks (README.md, docs/) are the "docs" tier.

Standard library only: CI runs it with the system Python after the venv's tests.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass

TIERS = ("unit", "adapters", "cli", "multiproc", "multihost", "container")


@dataclass(frozen=True)
class TestTime:
    tier: str
    test: str          # path::name as pytest prints it
    seconds: float
    outcome: str       # passed, failed, error, skipped
    cpu: float | None = None    # CPU seconds (the cpu_s property), None where not recorded


def tier_of(classname: str) -> str:
    """``tests.multiproc.test_elastic`` -> multiproc; a docs page's blocks (``README.md``, ``docs.API.md``) -> docs."""
    parts = classname.split(".")
    if len(parts) > 1 and parts[0] == "tests" and parts[1] in TIERS:
        return parts[1]
    return "docs"


def _outcome(case: ET.Element) -> str:
    for child, word in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        if case.find(child) is not None:
            return word
    return "passed"


def read(path: str) -> list[TestTime]:
    """Each ``testcase`` of a JUnit XML file that pytest wrote (``--junitxml``)."""
    root = ET.parse(path).getroot()
    out = []
    for case in root.iter("testcase"):
        classname = case.get("classname", "")
        module = classname.replace(".", "/") + ".py" if classname.startswith("tests.") else classname
        name = re.sub(r"@(multiproc|others)$", "", case.get("name", ""))     # make test's lane (xdist_group)
        cpu = next((float(p.get("value")) for p in case.iter("property") if p.get("name") == "cpu_s"), None)
        out.append(TestTime(tier_of(classname), f"{module}::{name}",
                            float(case.get("time", 0) or 0), _outcome(case), cpu))
    return out


def by_tier(times: list[TestTime]) -> dict[str, dict[str, float]]:
    """{tier: {"tests": n, "seconds": s}}, tiers in the suite's order."""
    out: dict[str, dict[str, float]] = {}
    for tier in (*TIERS, "docs"):
        mine = [t for t in times if t.tier == tier]
        if mine:
            out[tier] = {"tests": len(mine), "seconds": round(sum(t.seconds for t in mine), 1)}
            if any(t.cpu is not None for t in mine):
                out[tier]["cpu"] = round(sum(t.cpu or 0.0 for t in mine), 1)
    return out


def _cpu(value: float | None) -> str:
    return f"{value:8.1f}" if value is not None else f"{'-':>8s}"


def render(times: list[TestTime], slowest: int) -> str:
    tiers = by_tier(times)
    total = sum(t.seconds for t in times)
    cpu = sum(t.cpu for t in times if t.cpu is not None) if any(t.cpu is not None for t in times) else None
    lines = [f"{'tier':10s} {'tests':>6s} {'seconds':>9s} {'share':>6s} {'cpu s':>8s}"]
    for tier, row in tiers.items():
        seconds = sum(t.seconds for t in times if t.tier == tier)
        lines.append(f"{tier:10s} {int(row['tests']):6d} {seconds:9.1f} {seconds / max(total, 1e-9):6.1%} "
                     f"{_cpu(row.get('cpu'))}")
    lines.append(f"{'all':10s} {len(times):6d} {total:9.1f} {'':6s} {_cpu(cpu)}")
    for title, key in (("slowest", lambda t: -t.seconds), ("most CPU", lambda t: -(t.cpu or 0.0))):
        if title == "most CPU" and cpu is None:
            continue
        lines.append(f"\n{title} {min(slowest, len(times))} (seconds, cpu seconds):")
        for t in sorted(times, key=key)[:slowest]:
            lines.append(f"{t.seconds:8.1f}s {_cpu(t.cpu)}  {t.tier:9s} {t.test}"
                         f"{'' if t.outcome == 'passed' else f'  ({t.outcome})'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("junit", help="the JUnit XML file pytest wrote with --junitxml")
    p.add_argument("--slowest", type=int, default=30, help="how many of the slowest tests to list (default 30)")
    p.add_argument("--json", action="store_true", help="print the tiers and every test's time as JSON")
    args = p.parse_args(argv)
    try:
        times = read(args.junit)
    except (OSError, ET.ParseError) as exc:
        print(f"test_durations: cannot read {args.junit} ({exc}): run pytest with --junitxml={args.junit}",
              file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"tiers": by_tier(times), "tests": [asdict(t) for t in times]}, indent=1))
    else:
        print(render(times, args.slowest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
