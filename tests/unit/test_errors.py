"""One error family: every mistake hvdkit names is a UserError, which the CLI prints as one line and exit 2."""

import ast

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

# Built-in exceptions a user's mistake used to surface as (issue 38 counted six types).
BUILTINS = {"ValueError", "TypeError", "RuntimeError", "FileNotFoundError", "FloatingPointError", "KeyError"}


def sources():
    for path in sorted((ROOT / "hvdkit").rglob("*.py")):
        yield path.relative_to(ROOT), ast.parse(path.read_text())


def test_hvdkit_raises_no_builtin_error_for_a_mistake():
    def builtin_call(node):
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BUILTINS

    # raise ValueError(...), and a helper that builds the error for a raise elsewhere (return RuntimeError(...))
    raised = [f"{path}:{node.lineno} {node.exc.func.id}" for path, tree in sources() for node in ast.walk(tree)
              if isinstance(node, ast.Raise) and builtin_call(node.exc)]
    returned = [f"{path}:{node.lineno} {node.value.func.id}" for path, tree in sources() for node in ast.walk(tree)
                if isinstance(node, ast.Return) and builtin_call(node.value)]
    assert raised + returned == []


def test_every_hvdkit_error_class_is_a_user_error_and_nothing_else():
    # Read from the source, as the layer test does: the adapters' modules need a framework to import.
    bases = {node.name: [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases]
             for _, tree in sources() for node in ast.walk(tree)
             if isinstance(node, ast.ClassDef) and node.name.endswith("Error")}
    assert len(bases) >= 10 and bases["UserError"] == ["Exception"]

    def roots(name):
        return {name} if name not in bases or name == "UserError" else set().union(*map(roots, bases[name]))

    strays = {name: sorted(roots(name)) for name in bases if roots(name) != {"UserError"}}
    assert strays == {}, "each error derives from UserError only (one family, one line and exit 2 in the CLI)"
