"""Docs are code: pytest runs the blocks of README.md and docs/*.md through Sybil (tests/docblocks/).

Python blocks are in the ``adapters`` tier (hvdkit.torch in this process, world size 1), bash blocks in
the ``cli`` tier (commands as subprocesses), the README's diffs in the ``multiproc`` tier (horovodrun -np 2).
``-m unit`` runs none of them (and reads only README.md, to deselect its blocks).
"""

from pathlib import Path

import pytest
from sybil import Sybil
from sybil.evaluators.skip import Skipper
from sybil.integration.pytest import SybilItem
from sybil.parsers.markdown import PythonCodeBlockParser

from tests.docblocks.blocks import BashParser, DiffParser, NotRunParser, run_bash, run_diff, setup_page, teardown_page

pytest_plugins = ("tests.cpu_seconds",)      # each test's CPU seconds in the JUnit XML, the docs' blocks' too

_collect_blocks = Sybil(parsers=[DiffParser(), BashParser(), PythonCodeBlockParser(), NotRunParser()],
                       patterns=["README.md", "docs/*.md"], setup=setup_page, teardown=teardown_page).pytest()


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    # -m unit reads no docs/ page. README.md, named in testpaths, must still be collected (pytest errors on a
    # test path that yields nothing): it is parsed, and its blocks are deselected.
    if parent.config.getoption("markexpr") == "unit" and file_path.name != "README.md":
        return None
    return _collect_blocks(file_path, parent)


def pytest_collection_modifyitems(items: list) -> None:
    """Each block's tier; a not-run marker takes the tier of the block it checks, so that both run (or not) together."""
    tiers = {run_diff: pytest.mark.multiproc, run_bash: pytest.mark.cli}
    docs = [item for item in items if isinstance(item, SybilItem)]
    for i, item in enumerate(docs):
        target = item
        while isinstance(target.example.region.evaluator, Skipper) and i + 1 < len(docs):
            i += 1
            target = docs[i]
        item.add_marker(tiers.get(target.example.region.evaluator, pytest.mark.adapters))
