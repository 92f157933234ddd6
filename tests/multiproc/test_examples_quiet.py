"""Every script in examples/ runs on 2 ranks, as its docstring launches it, without one `hvdkit:` warning.

A warning on a correct script teaches users to ignore hvdkit's warnings (issue 35: every torch run warned
"0 parameter(s) got no gradient"). A new example fails here until it has a row below.
"""

import re
import sys

import pytest

from tests.conftest import ROOT, _tool, job_env, run_horovodrun, run_job

pytestmark = pytest.mark.multiproc

ELASTIC = ["-np", "2", "--min-np", "1", "--max-np", "2", "--network-interface", "lo",
           "--host-discovery-script", str(ROOT / "examples" / "discover_hosts.sh")]
RUNS = {  # id: (example, its arguments, elastic launch)
    "pytorch_mnist": ("pytorch_mnist.py", ["--epochs", "2"], False),
    # --resume with nothing to resume yet (a requeued job's first run) starts from scratch
    "pytorch_mnist-checkpoint": ("pytorch_mnist.py", ["--epochs", "1", "--checkpoint-dir", "{tmp}/ckpt/", "--resume"],
                                 False),
    "pytorch_elastic": ("pytorch_elastic.py", ["--epochs", "1"], True),
    "keras_elastic-tensorflow": ("keras_elastic.py", ["--backend", "tensorflow", "--epochs", "1"], True),
}
# Examples whose 2-rank run elsewhere asserts the same (one job checks both: CI's 2 cores pay per job).
QUIET_ELSEWHERE = {"keras_mnist.py": "test_keras_adapter.py::test_keras_example_trains_on_digits (torch, tf_keras) "
                                     "and test_bf16.py::test_bf16_compression_trains_the_examples_as_well_as_float32 "
                                     "(tensorflow)"}
# hvdkit's own warnings, and Python warnings raised from hvdkit's code (a deprecated torch name it touched).
WARNING = re.compile(r"^.*(\bhvdkit: |/hvdkit/\S+\.py:\d+: \w*Warning).*$", re.MULTILINE)


def test_every_example_has_a_run():
    examples = {p.name for p in (ROOT / "examples").glob("*.py")}
    assert examples == {example for example, _, _ in RUNS.values()} | set(QUIET_ELSEWHERE), \
        "add a row to RUNS for each example"


@pytest.mark.parametrize("run", sorted(RUNS))
def test_example_runs_on_two_ranks_without_a_warning(tmp_path, run):
    example, args, elastic = RUNS[run]
    argv = [str(ROOT / "examples" / example), *(a.format(tmp=tmp_path) for a in args), "--json"]
    if elastic:
        hosts = tmp_path / "hosts"
        hosts.write_text("localhost slots=2\n")
        cmd = [_tool("horovodrun"), *ELASTIC, sys.executable, *argv]
        proc = run_job(cmd, timeout=300, env=job_env(HVDKIT_ELASTIC_HOSTS=str(hosts)))
    else:
        proc = run_horovodrun(2, argv, timeout=300, pool="torch")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert re.search(r'"size": 2\b', proc.stdout), f"no 2-rank result line:\n{proc.stdout[-2000:]}"
    assert_no_warning(proc.stdout)


def assert_no_warning(output: str) -> None:
    warnings = [m.group(0) for m in WARNING.finditer(output)]
    assert warnings == [], "\n".join(warnings)
