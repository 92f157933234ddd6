"""`hvdkit env` as users run it: the installed console command."""

import json

import pytest

from tests.conftest import run_hvdkit

pytestmark = pytest.mark.cli


def test_env_json_reports_frameworks_and_horovod_build():
    proc = run_hvdkit("env", "--json", timeout=180)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    for name in ("torch", "tensorflow", "keras", "horovod"):
        assert report["packages"][name], f"{name} missing from the report"
    assert report["packages"]["horovod"] == "0.28.1"
    build = report["horovod"]
    assert build["frameworks"]["torch"] and build["frameworks"]["tensorflow"]
    assert build["controllers"] == {"mpi": True, "gloo": True}
    assert build["tensor_operations"]["mpi"] and build["tensor_operations"]["gloo"]
    assert report["mpi"] and "Open MPI" in report["mpi"]
    # The torch module reports the standard it was compiled with: C++20 for torch >= 2.14.
    from tests.cli.test_install_script import pins

    major, minor = (int(v) for v in pins()["TORCH_VERSION"].split(".")[:2])
    assert build["torch_cxx_standard"] == ("C++20" if (major, minor) >= (2, 14) else "C++17")
    assert report["packages"]["torch"] == pins()["TORCH_VERSION"]


def test_env_text_looks_like_check_build():
    proc = run_hvdkit("env", timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "[X] torch" in proc.stdout and "[X] gloo" in proc.stdout
    assert "torch module       C++" in proc.stdout


def test_no_subcommand_prints_help_and_fails():
    proc = run_hvdkit(timeout=60)
    assert proc.returncode == 2 and "env" in proc.stdout


def test_require_fails_naming_what_the_build_lacks():
    """What install.sh and Dockerfile.gpu check a build with: exit 1 and one line naming the missing features."""
    assert run_hvdkit("env", "--require", "torch,tensorflow,mpi,gloo", timeout=180).returncode == 0
    proc = run_hvdkit("env", "--require", "torch,nccl,cuda", timeout=180)      # this venv is the CPU flavour
    assert proc.returncode == 1
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        "hvdkit env: error: Horovod was built without nccl, cuda: rebuild it with scripts/install.sh "
        "(--gpu for nccl and cuda)"]
    assert "[X] torch" in proc.stdout, "the report is still printed in full"
    bad = run_hvdkit("env", "--require", "torch,ncll", timeout=60)
    assert bad.returncode == 2 and "ncll is not a Horovod build feature: name some of torch," in bad.stderr
