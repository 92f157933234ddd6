"""scripts/test_durations.py: the per-tier table and slowest tests that .ci/run prints from pytest's JUnit XML."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.multiproc.test_elastic" name="test_shrink[gloo]@multiproc" time="41.5" />
<testcase classname="tests.multiproc.test_elastic" name="test_grow" time="20.0"><failure message="x">x</failure>
</testcase>
<testcase classname="tests.unit.test_lr" name="test_rule" time="0.01" />
<testcase classname="docs.API.md" name="line:12,column:1" time="3.5" />
<testcase classname="tests.multihost.test_slurm" name="test_sbatch@others" time="7.25" />
</testsuite></testsuites>
"""


def run(tmp_path, *args):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "test_durations.py"), str(path), *args],
                          capture_output=True, text=True, timeout=60)


def test_tiers_and_the_slowest_tests(tmp_path):
    proc = run(tmp_path, "--slowest", "2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    rows = [line.split()[:3] for line in lines[1:6]]
    assert rows == [["unit", "1", "0.0"], ["multiproc", "2", "61.5"], ["multihost", "1", "7.2"],
                    ["docs", "1", "3.5"], ["all", "5", "72.3"]]
    slowest = lines[-2:]          # without the lane make test's xdist adds to each name
    assert slowest[0].endswith("tests/multiproc/test_elastic.py::test_shrink[gloo]")
    assert slowest[1].endswith("tests/multiproc/test_elastic.py::test_grow  (failed)")


def test_json_and_an_unreadable_file(tmp_path):
    proc = run(tmp_path, "--json")
    data = json.loads(proc.stdout)
    assert data["tiers"]["multiproc"] == {"tests": 2, "seconds": 61.5}
    assert {t["outcome"] for t in data["tests"]} == {"passed", "failed"}
    missing = subprocess.run([sys.executable, str(ROOT / "scripts" / "test_durations.py"), str(tmp_path / "no.xml")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "--junitxml=" in missing.stderr


def test_cpu_seconds_where_the_suite_recorded_them(tmp_path):
    """tests/cpu_seconds.py records each test's CPU seconds as the JUnit property cpu_s; a wall time in make test's
    two lanes grows with the other lane's load, the CPU seconds do not."""
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT.replace('name="test_grow" time="20.0">',
                                  'name="test_grow" time="20.0"><properties><property name="cpu_s" value="55.5"/>'
                                  '</properties>'))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "test_durations.py"), str(path), "--slowest", "1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[-2:] == ["cpu", "s"] and lines[2].split() == ["multiproc", "2", "61.5", "85.1%", "55.5"]
    assert lines[-2].startswith("most CPU 1") and lines[-1].split()[:2] == ["20.0s", "55.5"]
    data = json.loads(subprocess.run([sys.executable, str(ROOT / "scripts" / "test_durations.py"), str(path),
                                      "--json"], capture_output=True, text=True, timeout=60).stdout)
    assert data["tiers"]["multiproc"]["cpu"] == 55.5 and "cpu" not in data["tiers"]["unit"]
