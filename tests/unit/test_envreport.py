import json
import sys

import pytest

from hvdkit.ops import envreport
from hvdkit.ops.horovod_probe import _nccl_version_string

pytestmark = pytest.mark.unit

PROBE_OK = {
    "installed": True, "version": "0.28.1",
    "frameworks": {"tensorflow": False, "torch": True},
    "controllers": {"mpi": True, "gloo": True},
    "tensor_operations": {"nccl": False, "ddl": False, "ccl": False, "mpi": True, "gloo": True},
    "nccl_version": None, "cuda_built": False,
}


def test_parse_probe_builds_report_fields():
    build, err = envreport.parse_probe(PROBE_OK)
    assert err is None
    assert build.frameworks["torch"] and build.controllers == {"mpi": True, "gloo": True}


def test_parse_probe_not_installed_and_unusable():
    assert envreport.parse_probe({"installed": False, "error": "No module named 'horovod'"}) == (
        None, "No module named 'horovod'")
    build, err = envreport.parse_probe({"installed": True, "version": "0.28.1", "frameworks": {},
                                        "errors": {"torch": "OSError: undefined symbol"}})
    assert build is None and "undefined symbol" in err


def test_nccl_version_code():
    assert _nccl_version_string(22105) == "2.21.5"
    assert _nccl_version_string(2708) == "2.7.8"


def test_render_text_marks_flags_like_check_build():
    build, _ = envreport.parse_probe(PROBE_OK)
    report = envreport.EnvReport(
        hvdkit="0.1.0", python="3.11.7", python_executable="/x/python", platform="Linux",
        packages={"torch": "2.13.0+cpu", "tensorflow": None}, torch_cuda=None, horovod=build,
        horovod_error=None, mpi="mpirun (Open MPI) 4.1.4", gpus=[])
    text = envreport.render_text(report)
    assert "[X] torch" in text and "[ ] tensorflow" in text and "[X] gloo" in text
    assert "tensorflow  not installed" in text and "NCCL               not built" in text
    assert json.loads(json.dumps(report.to_dict()))["horovod"]["version"] == "0.28.1"


def test_render_text_lists_the_gpu_generations_the_library_was_built_for():
    build, _ = envreport.parse_probe(dict(PROBE_OK, cuda_built=True, nccl_version="2.30.7",
                                          cuda_arches={"sass": [75, 80, 90, 100, 120], "ptx": [120]}))
    report = envreport.EnvReport(
        hvdkit="0.1.0", python="3.11.7", python_executable="/x/python", platform="Linux",
        packages={"torch": "2.14.1"}, torch_cuda="13.0", horovod=build,
        horovod_error=None, mpi="mpirun (Open MPI) 4.1.4", gpus=[])
    assert "CUDA kernels for   sm_75 sm_80 sm_90 sm_100 sm_120 (+ PTX compute_120)" in envreport.render_text(report)
    assert report.to_dict()["horovod"]["cuda_arches"]["sass"][0] == 75


def test_horovod_settings_are_shown_and_a_misread_one_is_marked_with_launchs_words():
    """Issue 35: HOROVOD_FUSION_THRESHOLD=lots was missing from `hvdkit env` while `hvdkit launch` refused it."""
    from hvdkit.common.errors import UserError
    from hvdkit.common.tuning import check_horovod_environment

    environ = {"HOROVOD_FUSION_THRESHOLD": "lots", "HOROVOD_CYCLE_TIME": "0.1", "PATH": "/bin"}
    settings, errors = envreport.horovod_settings(environ)
    assert settings == {"HOROVOD_CYCLE_TIME": "0.1", "HOROVOD_FUSION_THRESHOLD": "lots"}
    with pytest.raises(UserError) as launch_refusal:
        check_horovod_environment(environ)
    assert list(errors.values()) == [str(launch_refusal.value)]
    report = envreport.EnvReport(
        hvdkit="0.1.0", python="3.11.7", python_executable="/x/python", platform="Linux", packages={},
        torch_cuda=None, horovod=None, horovod_error="not installed", mpi=None, gpus=[],
        horovod_settings=settings, setting_errors=errors)
    text = envreport.render_text(report)
    assert "HOROVOD_CYCLE_TIME=0.1\n" in text
    assert "HOROVOD_FUSION_THRESHOLD=lots  INVALID (hvdkit launch refuses it)" in text
    assert report.to_dict()["setting_errors"] == errors


def test_tensorflows_cuda_is_read_from_its_build_info_without_importing_it(tmp_path, monkeypatch):
    """The TF GPU flavour's report names TensorFlow's CUDA (build_info.py, as TF's GPU wheels write it);
    a CPU build (tensorflow-cpu) and no TensorFlow give None, and the text shows the line only with TF."""
    import sys

    platform_dir = tmp_path / "tensorflow" / "python" / "platform"
    platform_dir.mkdir(parents=True)
    (tmp_path / "tensorflow" / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    info = platform_dir / "build_info.py"
    info.write_text("import collections\nbuild_info = collections.OrderedDict([('cpu_compiler', 'clang'), "
                    "('cuda_version', '12.5.1'), ('cudnn_version', '9'), ('is_cuda_build', True)])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    assert envreport.tensorflow_cuda_version() == "12.5.1"
    info.write_text(info.read_text().replace("('is_cuda_build', True)", "('is_cuda_build', False)"))
    assert envreport.tensorflow_cuda_version() is None
    report = envreport.EnvReport(
        hvdkit="0.1.0", python="3.13.5", python_executable="/x/python", platform="Linux",
        packages={"torch": None, "tensorflow": "2.21.0"}, torch_cuda=None, horovod=None,
        horovod_error="x", mpi=None, gpus=[], tensorflow_cuda="12.5.1", tensorflow_cuda_wheels=True)
    text = envreport.render_text(report)
    assert "TF CUDA     12.5.1\n" in text and "torch CUDA" not in text
    assert envreport.EnvReport.from_dict(report.to_dict()).tensorflow_cuda == "12.5.1"
    # The CPU flavour: tf-keras brings PyPI's (CUDA-built) tensorflow, without the CUDA wheels.
    report.tensorflow_cuda_wheels = False
    assert "TF CUDA     12.5.1 build, but no CUDA 12 wheels (tensorflow[and-cuda])" in envreport.render_text(report)


def test_the_probe_record_is_read_instead_of_probing_and_renamed_by_a_rebuild(tmp_path, monkeypatch):
    """hvdkit launch asks probe_horovod on every job; a clean answer is kept, named by what it depends on."""
    fake = tmp_path / "site" / "horovod"
    (fake / "torch").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    lib = fake / "torch" / "mpi_lib_v2.cpython-311-x86_64-linux-gnu.so"
    lib.write_bytes(b"x" * 10)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "horovod", raising=False)    # find_spec answers from sys.modules first
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls = []

    def probe(argv, timeout, env):
        calls.append(argv)
        return 0, json.dumps(PROBE_OK), ""

    monkeypatch.setattr(envreport, "run_bounded", probe)
    first = envreport.probe_horovod()
    path = envreport.probe_cache_path()
    assert first[0] is not None and len(calls) == 1 and path.parent == tmp_path / "cache" / "hvdkit"
    assert envreport.probe_horovod() == first and len(calls) == 1, "the second ask must read the record"
    lib.write_bytes(b"x" * 11)                   # a rebuilt library: another name, so the probe runs again
    assert envreport.probe_cache_path() != path
    envreport.probe_horovod()
    assert len(calls) == 2


def test_a_probe_answer_with_errors_is_not_kept(tmp_path, monkeypatch):
    fake = tmp_path / "site" / "horovod"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "horovod", raising=False)    # find_spec answers from sys.modules first
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    answer = dict(PROBE_OK, errors={"tensorflow": "ImportError: undefined symbol"})
    monkeypatch.setattr(envreport, "run_bounded", lambda argv, timeout, env: (0, json.dumps(answer), ""))
    build, _ = envreport.probe_horovod()
    assert build is not None and build.errors
    assert not envreport.probe_cache_path().exists()
