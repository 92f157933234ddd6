"""The README stays a five-minute read, and every link in it and in docs/ leads to a file that exists."""

import re

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_is_at_most_160_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 160


@pytest.mark.parametrize("page", ["README.md", *sorted(p.relative_to(ROOT).as_posix()
                                                       for p in (ROOT / "docs").glob("*.md"))])
def test_relative_links_resolve(page):
    path = ROOT / page
    missing = [target for target in LINK.findall(path.read_text())
               if "://" not in target and not (path.parent / target).exists()]
    assert not missing, f"{page} links to missing files: {missing}"


FENCE = re.compile(r"(?m)^[ \t]*```(\S*)[ \t]*$")
RUN = {"python", "diff", "bash"}            # the languages tests/docblocks runs (or checks, after a not-run marker)


@pytest.mark.parametrize("page", ["README.md", *sorted(p.relative_to(ROOT).as_posix()
                                                       for p in (ROOT / "docs").glob("*.md"))])
def test_every_code_block_is_in_a_language_the_docs_tests_run(page):
    """A ```sh or ```py block would escape Sybil unseen; a block with no language is output, not code."""
    fences = FENCE.findall((ROOT / page).read_text())
    opening = fences[::2]                   # fences alternate: opening (with its language), closing
    assert all(not f for f in fences[1::2]), f"{page}: a closing fence with a language"
    assert set(opening) <= RUN | {""}, f"{page}: blocks in {sorted(set(opening) - RUN - {''})}"
