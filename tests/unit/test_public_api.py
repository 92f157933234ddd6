"""docs/API.md lists every public name of both adapters, as their ``__all__`` says (read without importing Horovod:
torch's from its source, Keras's from the module, which loads its names on first use)."""

import ast
import re

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit


def dunder_all(package: str) -> set[str]:
    if package == "keras":
        import hvdkit.keras

        return set(hvdkit.keras.__all__)
    tree = ast.parse((ROOT / "hvdkit" / package / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"hvdkit/{package}/__init__.py has no __all__")


def table_columns() -> tuple[set[str], set[str]]:
    torch_names, keras_names = set(), set()
    for line in (ROOT / "docs" / "API.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        for cell, names in ((cells[1], torch_names), (cells[2], keras_names)):
            match = re.fullmatch(r"`(\w+)`", cell)
            if match:
                names.add(match.group(1))
            else:
                assert cell == "—", f"{cells[0]}: a cell is a `name` or —, not {cell!r}"
                assert len(cells[3]) > 20, f"{cells[0]}: say why one side lacks it"
    return torch_names, keras_names


def test_the_api_table_matches_both_adapters_all():
    torch_names, keras_names = table_columns()
    assert torch_names == dunder_all("torch")
    assert keras_names == dunder_all("keras")


def test_what_both_adapters_have_is_spelled_the_same():
    both = dunder_all("torch") & dunder_all("keras")
    for name in ("init", "Context", "current", "DistributedOptimizer", "broadcast_state", "scale_lr",
                 "save_checkpoint", "load_checkpoint", "CheckpointError", "metric_average", "elastic",
                 "seed_everything", "REQUEUE_EXIT_CODE"):
        assert name in both


def test_the_examples_import_only_the_public_api():
    """A user copies an example: every hvdkit import in it must be one API.md documents."""
    public = {"hvdkit.torch", "hvdkit.keras", "hvdkit.argtypes", "hvdkit.examples.datasets"}
    for path in sorted((ROOT / "examples").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                if name.split(".")[0] == "hvdkit":
                    assert name in public, f"{path.name} imports {name}, which API.md does not document"


def test_a_renamed_name_still_answers_with_a_deprecation_warning():
    from hvdkit.runtime.context import Context

    ctx = Context(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1, mode="tensorflow")
    with pytest.warns(FutureWarning, match="Context.mode"):
        assert ctx.backend == "tensorflow"


def test_the_old_argtypes_path_still_imports_with_a_deprecation_warning():
    import importlib
    import sys

    sys.modules.pop("hvdkit.common.argtypes", None)
    with pytest.warns(FutureWarning, match="import hvdkit.argtypes"):
        old = importlib.import_module("hvdkit.common.argtypes")
    from hvdkit.argtypes import positive_int

    assert old.positive_int is positive_int


def test_the_old_keras_mode_module_still_imports_with_a_warning():
    import importlib
    import sys

    sys.modules.pop("hvdkit.keras.backend", None)
    with pytest.warns(FutureWarning, match="import hvdkit.keras.mode"):
        old = importlib.import_module("hvdkit.keras.backend")
    from hvdkit.keras.mode import use_backend

    assert old.use_backend is use_backend
