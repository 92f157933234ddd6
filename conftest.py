"""Docs are code: pytest runs the blocks of README.md and docs/*.md through Sybil (tests/docblocks/).

Python blocks are in the ``adapters`` tier (hvdkit.torch in this process, world size 1), the README's
diffs in the ``multiproc`` tier (horovodrun -np 2). ``-m unit`` does not read the Markdown at all.
"""

from pathlib import Path

import pytest
from sybil import Sybil
from sybil.integration.pytest import SybilItem
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

from tests.docblocks.blocks import DiffParser, run_diff, setup_page, teardown_page

ROOT = Path(__file__).resolve().parent

pytest_collect_file = Sybil(parsers=[DiffParser(), PythonCodeBlockParser(), SkipParser()],
                            patterns=["README.md", "docs/*.md"], setup=setup_page, teardown=teardown_page).pytest()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("markexpr") == "unit" and (collection_path == ROOT / "README.md"
                                                   or collection_path.is_relative_to(ROOT / "docs")):
        return True
    return None


def pytest_collection_modifyitems(items: list) -> None:
    for item in items:
        if isinstance(item, SybilItem):
            item.add_marker(pytest.mark.multiproc if item.example.region.evaluator is run_diff
                            else pytest.mark.adapters)
