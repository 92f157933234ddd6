"""Packaging: requirements.lock and [tool.hvdkit] hold every pin, pyproject.toml declares what hvdkit imports.

Read from the files alone (through scripts/installer.py, their one reader); tests/cli/test_install_script.py
checks what scripts/install.sh makes of them, and that the lock is what `make lock` writes today.
"""

import ast
import importlib.util
import re
import tomllib

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit


def load_installer():
    spec = importlib.util.spec_from_file_location("hvdkit_installer", ROOT / "scripts" / "installer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


installer = load_installer()


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def locked() -> dict[str, str]:
    """Every package the lock pins, by normalized name (a package locked per Python version: its first line)."""
    out = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        m = installer.LOCKED.match(line)
        if m:
            out.setdefault(normalize(m["name"]), m["version"])
    return out


def requirement_name(req: str) -> str:
    return normalize(re.match(r"[A-Za-z0-9._-]+", req).group(0))


def test_lock_pins_every_requirement_of_every_extra_and_nothing_is_pinned_elsewhere():
    proj = project()["project"]
    extras = proj["optional-dependencies"]
    reqs = [*proj["dependencies"], *(r for rs in extras.values() for r in rs)]
    declared = {requirement_name(r) for r in reqs} - {"hvdkit"}
    assert declared - set(locked()) == set(), "declared in pyproject.toml but not in requirements.lock: run make lock"
    assert not [r for r in reqs if "==" in r], "exact versions belong in requirements.lock (make lock)"
    assert not (ROOT / "constraints.txt").exists(), "a second pin file beside requirements.lock"
    assert {"torch", "keras", "gpu", "gpu-build", "bench", "horovod", "dev"} <= set(extras)
    # The unit tier's extra pulls no framework: `pip install -e .[dev]` stays small.
    assert not {requirement_name(r) for r in extras["dev"]} & {"torch", "tensorflow-cpu", "keras", "horovod"}
    # Transitive dependencies are locked too, not only the direct ones (torch's CUDA wheels, TensorFlow's).
    assert {"nvidia-nccl-cu13", "protobuf", "typing-extensions"} <= set(locked())


def test_lock_lines_are_what_pip_reads_as_constraints():
    """Only `name==version [; marker]`, comments and blank lines: no URL, no editable, no option a -c file refuses."""
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        assert not line.strip() or line.lstrip().startswith("#") or installer.LOCKED.match(line), line


def test_pins_are_the_lock_and_the_tool_table():
    pins = installer.pins()
    table = project()["tool"]["hvdkit"]
    assert pins["HOROVOD_VERSION"] == table["horovod-version"] == "0.28.1"
    assert pins["TORCH_VERSION"] == locked()["torch"]
    assert pins["TENSORFLOW_VERSION"] == locked()["tensorflow-cpu"]       # the -cpu flavour suffix dropped
    assert re.fullmatch(r"[0-9a-f]{64}", pins["HOROVOD_SDIST_SHA256"])
    assert set(installer.REQUIRED) <= set(pins)
    # Horovod is built from its sdist, never installed from the lock.
    assert "horovod" not in locked()


def test_python_range_is_the_same_in_requires_python_and_the_table():
    table = project()["tool"]["hvdkit"]
    major, minor = (int(x) for x in table["python-max"].split("."))
    assert project()["project"]["requires-python"] == f">={table['python-min']},<{major}.{minor + 1}"
    assert project()["tool"]["ruff"]["target-version"] == "py" + table["python-min"].replace(".", "")


def test_a_broken_pin_file_is_one_line_naming_the_fix(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    with pytest.raises(installer.PinsError, match=r"requirements.lock is missing: restore it from git"):
        installer.pins(tmp_path)
    (tmp_path / "requirements.lock").write_text("numpy==2.4.6\n")
    with pytest.raises(installer.PinsError, match=r"no pin TORCH_VERSION, KERAS_VERSION, TENSORFLOW_VERSION in "):
        installer.pins(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    with pytest.raises(installer.PinsError, match=r"no \[tool.hvdkit\] table"):
        installer.pins(tmp_path)


def test_a_platform_only_pin_is_not_read_as_everyones():
    text = "torch==2.14.1\nnvidia-nccl-cu13==2.30.7 ; sys_platform == 'linux'\n    # via torch\n"
    assert installer.locked_versions(text) == {"TORCH_VERSION": "2.14.1"}


def test_uv_is_told_where_pip_finds_packages():
    """uv reads no pip.conf: the machine's mirrors, links, timeout and certificate reach it, PIP_* winning as in pip."""
    listed = "\n".join([
        "global.cert='/etc/ssl/certs/ca.crt'",
        "global.extra-index-url='file:///opt/pypi/simple file:///opt/more/simple'",
        "global.find-links='/opt/wheels'",
        "global.index-url='https://mirror.example/simple'",
        "install.index-url='https://install-section.example/simple'",
        ":env:.default-timeout='180'",
        ":env:.find-links='/env/wheels /env/more'",
    ])
    assert installer.uv_env(listed) == [
        "export UV_DEFAULT_INDEX=https://install-section.example/simple",
        "export UV_INDEX='file:///opt/pypi/simple file:///opt/more/simple'",
        "export UV_FIND_LINKS=/env/wheels,/env/more",
        "export UV_HTTP_TIMEOUT=180",
        "export SSL_CERT_FILE=/etc/ssl/certs/ca.crt",
    ]
    assert installer.uv_env("") == []
    # pip.conf's list on several lines (pip prints it as a literal with '\n'), proxy for both schemes, no cache.
    listed = "global.extra-index-url='\\nhttps://a/simple\\nhttps://b/simple'\nglobal.proxy='http://p:3128'\n" \
             ":env:.no-cache-dir='1'"
    assert installer.uv_env(listed) == ["export UV_INDEX='https://a/simple https://b/simple'",
                                        "export HTTPS_PROXY=http://p:3128", "export HTTP_PROXY=http://p:3128",
                                        "export UV_NO_CACHE=1"]


def test_install_script_writes_no_version():
    """Every version comes from the lock or [tool.hvdkit]: no `pkg==1.2`, no `SOME_VERSION=1.2` in the script."""
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert not re.findall(r"[A-Za-z0-9]==[0-9]", script)
    assert not re.findall(r"(?m)^\s*[A-Z0-9_]+=[\"']?[0-9]+\.[0-9]", script)
    assert 'LOCK="$ROOT/requirements.lock"' in script and "scripts/installer.py\" pins" in script


def test_install_script_parses_no_toml_and_no_pins():
    """scripts/installer.py is the one reader; the script holds no awk, no tomllib, no sed over a pin file."""
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert "awk" not in script and "tomllib" not in script and "optional-dependencies" not in script
    assert len(script.splitlines()) < 250


def test_user_install_installs_no_test_tools():
    """sshd, Slurm, the container engine and the dev extra: scripts/test-setup.sh, which only test targets run."""
    script = (ROOT / "scripts" / "install.sh").read_text()
    for tool in ("openssh-server", "slurm-wlm", "docker.io", "debootstrap", "pytest", "ruff", "hadolint"):
        assert tool not in script, f"scripts/install.sh installs {tool}"
    make = (ROOT / "Makefile").read_text()
    rules = dict(re.findall(r"(?m)^([$()A-Za-z_.-]+):[^\n]*\n((?:\t[^\n]*\n)*)", make))
    for target in ("$(STAMP)", "install-gpu", "demo"):
        assert "test-setup" not in rules[target] and "TEST_STAMP" not in rules[target], target
    assert "scripts/test-setup.sh" in rules["$(TEST_STAMP)"]


def test_unit_tests_live_in_tests_unit_only():
    """conftest.py reads only tests/unit for `-m unit`, so a unit test elsewhere would never run."""
    for path in (ROOT / "tests").rglob("*.py"):
        if path.parent.name != "unit" and "mark.unit" in path.read_text():
            pytest.fail(f"{path.relative_to(ROOT)} marks a unit test outside tests/unit")


def test_unit_modules_import_no_framework_at_the_top():
    """The unit tier runs in a venv with only the dev extra: no torch, TensorFlow, Keras or Horovod."""
    heavy = {"torch", "tensorflow", "keras", "tf_keras", "horovod", "mpi4py"}
    for path in sorted((ROOT / "tests" / "unit").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] not in heavy, f"{path.name} imports {name}"
                assert not name.startswith(("hvdkit.torch", "hvdkit.keras", "hvdkit.bench.models",
                                            "hvdkit.bench.allreduce", "hvdkit.bench.train")), f"{path.name}: {name}"
