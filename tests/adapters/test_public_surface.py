"""What a user sees of both adapters: ``dir()`` lists the documented names and nothing else, the error classes the
docs name are there, and importing an adapter changes nothing in Horovod."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, job_env
from tests.unit.test_public_api import table_columns

pytestmark = pytest.mark.adapters


def python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=job_env(),
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_dir_of_each_adapter_is_the_documented_list():
    torch_names, keras_names = table_columns()
    shown = json.loads(python("import json, hvdkit.torch, hvdkit.keras\n"
                              "print(json.dumps([dir(hvdkit.torch), dir(hvdkit.keras)]))"))
    public = [sorted(n for n in names if not n.startswith("__")) for names in shown]
    assert public == [sorted(torch_names), sorted(keras_names)]


def test_the_error_classes_the_docs_name_are_exported_and_are_user_errors():
    for adapter in ("torch", "keras"):
        out = python(f"import hvdkit.{adapter} as hk\n"
                     "print(all(issubclass(getattr(hk, n), hk.UserError) for n in\n"
                     "    ('CheckpointError', 'NoGPUError', 'NonFiniteGradientError')))")
        assert out.strip() == "True", adapter


def test_importing_hvdkit_torch_leaves_horovods_elastic_registry_as_it_was():
    out = python("import horovod.torch as hvd\n"
                 "before = list(hvd.elastic.state.get_handler_registry())\n"
                 "import hvdkit.torch\n"
                 "print(before == list(hvd.elastic.state.get_handler_registry()))")
    assert out.strip() == "True"
