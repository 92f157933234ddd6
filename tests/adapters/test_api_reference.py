"""docs/REFERENCE.md is what scripts/api_reference.py reads from the code: every public name, its signature and
docstring (issue 54, case 7: ResumableDistributedSampler's constructor was documented nowhere)."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT, job_env

pytestmark = pytest.mark.adapters


def test_the_reference_is_what_the_code_gives():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "api_reference.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=job_env())
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_every_name_of_both_adapters_has_an_entry_with_its_signature():
    text = (ROOT / "docs" / "REFERENCE.md").read_text()
    for adapter in ("torch", "keras"):
        names = subprocess.run([sys.executable, "-c", f"import hvdkit.{adapter} as m; print(' '.join(m.__all__))"],
                               capture_output=True, text=True, timeout=300, env=job_env(), cwd=ROOT).stdout.split()
        assert names, adapter
        for name in names:
            assert f"### `{adapter}.{name}`" in text, f"{adapter}.{name} has no entry"
    assert "ResumableDistributedSampler(dataset: 'Dataset', *, num_replicas: 'int', rank: 'int'" in text
