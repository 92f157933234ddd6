"""The Horovod patch series: the order file names every patch in the folder once, each patch says where it
came from and what tests it, and docs/FRAMEWORKS.md has a row for each (applying it:
tests/cli/test_install_script.py)."""

import re

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit
SERIES = ROOT / "scripts" / "patches" / "horovod-0.28.1"


def series() -> list[str]:
    return [line for line in (SERIES / "series").read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_the_series_names_every_patch_in_the_folder_once_in_numbered_order():
    names = series()
    assert sorted(names) == sorted(p.name for p in SERIES.glob("*.patch"))
    assert names == sorted(names) and len(set(names)) == len(names)
    assert [int(n[:2]) for n in names] == list(range(1, len(names) + 1))


def test_each_patch_has_a_why_an_upstream_line_and_a_test_before_its_diff():
    for name in series():
        text = (SERIES / name).read_text()
        header = text[:text.index("\n--- a/")]
        assert len(header.split("\n\n")[0].split()) >= 12, f"{name}: say what broke and why this fixes it"
        assert re.search(r"^Upstream: \S", header, re.M), name
        test = re.search(r"^Test: (.+)$", header, re.M)
        assert test, name
        for path in re.findall(r"tests/[\w/]+\.py", test.group(1)):
            assert (ROOT / path).exists(), f"{name} names {path}, which does not exist"


def test_frameworks_md_has_a_row_for_each_patch():
    doc = (ROOT / "docs" / "FRAMEWORKS.md").read_text()
    rows = re.findall(r"^\| `(\d\d-[\w-]+\.patch)` \|", doc, re.M)
    assert rows == series()
