"""Imports run one way, cli -> bench -> adapters -> backends -> runtime | ops -> common, and never upward or across.

Read from the source (every ``import``, lazy ones inside functions too), so
the check needs neither Horovod nor a framework.
"""

import ast

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

# Lower layers never import higher ones. Packages on one layer never import each other: the two adapters,
# and the rank's runtime and the launching machine's ops (what both need lives in common).
LAYER = {"argtypes": -1, "common": 0, "examples": 1, "runtime": 1, "ops": 1, "backends": 2, "torch": 3, "keras": 3,
         "bench": 4, "cli": 5, "selfcheck": 6, "__main__": 6}   # the two programs


def module_name(path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    graph = {}
    for path in sorted((ROOT / "hvdkit").rglob("*.py")):
        name, targets = module_name(path), set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # "from hvdkit.cli import bench" imports hvdkit.cli.bench
                targets |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {t for t in targets if t == "hvdkit" or t.startswith("hvdkit.")}
    modules = set(graph)
    return {m: {t for t in ts if t in modules and t != m} for m, ts in graph.items()}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def violations(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, targets in graph.items():
        here = layer(module)
        for target in targets:
            there = layer(target)
            if here is None or there is None:
                continue          # the package root (hvdkit.__version__) imports nothing of ours
            if LAYER[there] > LAYER[here] or (LAYER[there] == LAYER[here] and there != here):
                wrong.append(f"{module} -> {target}")
    return wrong


def cycles(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    found = []

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_no_import_goes_up_a_layer_or_across_adapters():
    assert not violations(imports()), "against the layers: " + ", ".join(violations(imports()))


def test_the_import_graph_has_no_cycle():
    assert not cycles(imports())


def test_the_package_root_imports_nothing_of_ours():
    assert imports()["hvdkit"] == set()


def test_no_package_mixes_what_runs_in_a_rank_with_what_runs_on_the_launching_machine():
    packages = {layer(m) for m in imports() if layer(m)}
    assert "core" not in packages            # the one flat folder is gone
    assert {"common", "runtime", "ops", "examples"} <= packages
    assert set(LAYER) >= packages, f"a new package needs its layer: {packages - set(LAYER)}"


def test_the_checks_catch_what_they_look_for():
    graph = imports()
    assert "hvdkit.ops.remote" in graph["hvdkit.cli.launch"]      # lazy and from-imports are both read
    assert violations({"hvdkit.ops.doctor": {"hvdkit.torch.context"}, "hvdkit.keras.data": {"hvdkit.torch.data"},
                       "hvdkit.runtime.context": {"hvdkit.ops.slurm"}, "hvdkit.ops.launch": {"hvdkit.common.errors"},
                       "hvdkit.bench.runner": {"hvdkit.ops.launch"}}) == [
        "hvdkit.ops.doctor -> hvdkit.torch.context", "hvdkit.keras.data -> hvdkit.torch.data",
        "hvdkit.runtime.context -> hvdkit.ops.slurm"]
    assert cycles({"hvdkit.cli.a": {"hvdkit.cli.b"}, "hvdkit.cli.b": {"hvdkit.cli.a"}}) == [
        "hvdkit.cli.a -> hvdkit.cli.b -> hvdkit.cli.a"]


def test_the_adapters_call_no_horovod_collective_and_read_no_hidden_attribute():
    """Collectives go through the Backend (hvdkit/backends/), and what hvdkit keeps on an optimizer through its
    one record (hvdkit/runtime/optimizer_record.py): a reader finds each in one place."""
    import re

    collective = re.compile(r"\bhvd\.(allreduce|allgather|broadcast|alltoall|grouped_|synchronize|reducescatter|"
                            r"join|barrier|rank|size)\w*\(")
    for path in sorted((ROOT / "hvdkit").rglob("*.py")):
        text, where = path.read_text(), path.relative_to(ROOT).as_posix()
        if where.startswith(("hvdkit/torch/", "hvdkit/keras/")):
            assert not collective.search(text), f"{where}: {collective.search(text).group(0)} (use the Backend)"
        if where != "hvdkit/runtime/optimizer_record.py":
            assert not re.search(r"\._hvdkit\w*|[\"']_hvdkit\w*[\"']", text), f"{where} reads a _hvdkit attribute"
