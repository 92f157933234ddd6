"""`python -m hvdkit.selfcheck`, the allreduce `hvdkit doctor` launches: on a torch host, and on a host whose
Horovod has no torch module (TensorFlow/Keras only), where it must use horovod.tensorflow."""

import re

import pytest

from tests.conftest import horovodrun_cmd, run_job

pytestmark = pytest.mark.multiproc

# Makes `import horovod.torch` fail in the worker, as on a Horovod built without PyTorch.
WITHOUT_TORCH = ("import runpy, sys; sys.modules['horovod.torch'] = None; "
                 "runpy.run_module('hvdkit.selfcheck', run_name='__main__')")


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_selfcheck_sums_over_every_rank_with_the_framework_horovod_has(framework):
    argv = ["-m", "hvdkit.selfcheck"] if framework == "torch" else ["-c", WITHOUT_TORCH]
    proc = run_job(horovodrun_cmd(2, argv), timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = re.findall(r"hvdkit-selfcheck rank=(\d) size=(\d) host=\S+ framework=(\w+) ok=(\w+)", proc.stdout)
    assert sorted(lines) == [("0", "2", framework, "True"), ("1", "2", framework, "True")], proc.stdout[-3000:]
