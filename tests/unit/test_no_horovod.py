"""The unit tier runs without Horovod: importing every unit test module loads no ``horovod`` package."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit


def test_unit_test_modules_import_no_horovod():
    modules = sorted(f"tests.unit.{p.stem}" for p in (ROOT / "tests" / "unit").glob("test_*.py"))
    probe = ("import importlib, sys\n"
             f"for m in {modules!r}: importlib.import_module(m)\n"
             "print(sorted(n for n in sys.modules if n == 'horovod' or n.startswith('horovod.')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"unit tests imported Horovod: {out.stdout.strip()}"
    assert len(modules) > 10


def test_importing_the_keras_adapter_loads_neither_keras_nor_horovod():
    # Keras reads its backend once, at its first import: a script must still be able to choose it
    # (hk.use_backend) after `import hvdkit.keras`, and the pure backend module must stay pure.
    probe = ("import sys, hvdkit.keras, hvdkit.keras.mode\n"
             "print(sorted(n for n in sys.modules if n.split('.')[0] in ('horovod', 'keras', 'tensorflow', 'torch')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"import hvdkit.keras loaded: {out.stdout.strip()}"
