"""The docs' not-run markers must name tests that exist and run the block's commands (tests/docblocks/blocks.py)."""

import pytest

from tests.docblocks.blocks import block_commands, named_sources

pytestmark = pytest.mark.unit


def test_a_bash_blocks_commands_are_read_as_what_runs():
    block = ("EPOCHS=1 sbatch examples/slurm/train_gpu.sbatch   # a short run\n"
             "hvdkit launch -np 4 --min-np 2 \\\n    -- python examples/pytorch_elastic.py\n\n"
             "python3 -m venv .venv-dev\n.venv-dev/bin/pip install -e '.[dev]'\n")
    assert block_commands(block) == [["sbatch"], ["hvdkit", "launch"], ["venv"], ["pip", "install"]]


def test_a_marker_naming_a_missing_test_or_target_is_refused():
    problems, _ = named_sources("needs a cluster; tests/cli/test_launch_cli.py::test_that_does_not_exist runs it")
    assert problems == ["tests/cli/test_launch_cli.py defines no test_that_does_not_exist"]
    problems, _ = named_sources("tests/nowhere.py::test_x and Makefile:no-such-target")
    assert problems == ["tests/nowhere.py does not exist", "the Makefile has no target no-such-target"]
    problems, text = named_sources("Makefile:test-unit-dev runs it")
    assert problems == [] and "pytest -m unit" in text and "pip install" in text


def test_only_the_named_test_and_what_it_calls_count():
    """A command another test of the same module runs does not make the named test run it."""
    from tests.docblocks.blocks import mentions

    _, text = named_sources("tests/unit/test_docs_markers.py::test_a_marker_naming_a_missing_test_or_target_is_refused")
    assert mentions(text, "named_sources") and not mentions(text, "sbatch")
    _, text = named_sources("tests/unit/test_docs_markers.py::test_a_bash_blocks_commands_are_read_as_what_runs")
    assert mentions(text, "sbatch")
    # Words, with '_' between words: run_hvdkit runs hvdkit, a pipeline is not pip.
    assert mentions("run_hvdkit('launch')", "hvdkit") and not mentions("a pipeline", "pip")
