"""make test-gpu on a machine without a GPU: it refuses in one line, exit 2, and never passes.

What it runs on a GPU (scripts/gpu_acceptance.py) needs a GPU; docs/GPU.md records its numbers.
"""

import os
import re
import subprocess

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.cli


def test_make_test_gpu_refuses_in_one_line_on_a_cpu_machine(tmp_path):
    # An nvidia-smi that lists no GPU first on PATH: this test must not start the real run on a GPU host.
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexit 0\n")
    smi.chmod(0o755)
    proc = subprocess.run(["make", "-s", "test-gpu"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert proc.returncode != 0 and proc.stdout == "", proc.stdout
    # make's own lines ("make: ***", or "make[1]: ***" under an outer make such as `make test`) aside
    ours = [line for line in proc.stderr.splitlines() if not re.match(r"make(\[\d+\])?: ", line)]
    assert ours == ["make test-gpu: no NVIDIA GPU here (nvidia-smi lists none): it is the acceptance run for a GPU "
                    "machine, see docs/GPU.md"], proc.stderr


def test_with_a_gpu_but_no_gpu_flavour_it_names_the_install(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5a1f0000-1111-2222-3333-444455556666)'\n")
    smi.chmod(0o755)
    bare = tmp_path / "bare"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    proc = subprocess.run([str(bare / "bin" / "python"), "scripts/gpu_acceptance.py"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith("make test-gpu: no hvdkit beside ") and "make install-gpu" in proc.stderr
    assert proc.stderr.count("\n") == 1
