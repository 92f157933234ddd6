"""Sybil parsers and evaluators for the docs' blocks (see tests/docblocks/__init__.py).

Imports no framework: the unit tier (no torch, no Horovod) collects the Markdown files too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from sybil import Example
from sybil.evaluators.skip import Skipper
from sybil.parsers.abstract import AbstractSkipParser
from sybil.parsers.markdown import CodeBlockParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer

HERE = Path(__file__).resolve().parent
NP = 2
EPILOGUE = """
import json as _json
_ctx = hk.current()
open(f"rank{_ctx.rank}.json", "w").write(_json.dumps({"rank": _ctx.rank, "size": _ctx.size}))
"""


def split_diff(source: str) -> tuple[str, str]:
    """(original, hvdkit) scripts from a diff's body: ' ' lines go to both, '-' to the first, '+' to the second."""
    original, changed = [], []
    for n, line in enumerate(source.splitlines(), 1):
        mark, text = line[:1], line[1:]
        if mark not in (" ", "-", "+", ""):
            raise ValueError(f"diff line {n} starts with {mark!r}, not ' ', '-' or '+': {line!r}")
        if mark in (" ", "-", ""):
            original.append(text)
        if mark in (" ", "+", ""):
            changed.append(text)
    return "\n".join(original) + "\n", "\n".join(changed) + "\n"


def prelude_for(hvdkit_script: str) -> str:
    framework = "keras" if "import hvdkit.keras" in hvdkit_script else "torch"
    return (HERE / f"prelude_{framework}.py").read_text()


def run_diff(example: Example) -> None:
    """The '-' side as one process, the '+' side under horovodrun -np 2; each must exit 0 and the job be size 2."""
    from tests.conftest import horovodrun_cmd, run_job

    original, changed = split_diff(example.parsed)
    prelude = prelude_for(changed)
    for name, body, cmd in (("original", original, [sys.executable]),
                            ("hvdkit", changed + EPILOGUE, horovodrun_cmd(NP, []))):
        with tempfile.TemporaryDirectory(prefix=f"docs-diff-{name}-") as tmp:
            script = Path(tmp) / "train.py"
            script.write_text(prelude + "\n" + body)
            proc = run_job([*cmd, str(script)], timeout=300, cwd=Path(tmp))
            if proc.returncode != 0:
                raise AssertionError(f"the {name} side of {example.path}:{example.line} exited {proc.returncode}:\n"
                                     f"{proc.stdout[-4000:]}\n--- script ---\n{script.read_text()}")
            if name == "hvdkit":
                sizes = [json.loads((Path(tmp) / f"rank{r}.json").read_text())["size"] for r in range(NP)]
                assert sizes == [NP] * NP, f"the hvdkit side ran at sizes {sizes}, not {NP}"
                # A correct script gets no warning: one on every run teaches users to ignore them (issue 35).
                warnings = re.findall(r"^.*hvdkit: .*$", proc.stdout, re.MULTILINE)
                assert not warnings, f"{example.path}:{example.line} warned:\n" + "\n".join(warnings)


def run_bash(example: Example) -> None:
    """A ```bash block, in a temporary directory that links to every top-level entry of the repository."""
    from tests.conftest import ROOT, job_env, run_job

    with tempfile.TemporaryDirectory(prefix="docs-bash-") as tmp:
        for entry in ROOT.iterdir():
            if not entry.name.startswith("."):
                (Path(tmp) / entry.name).symlink_to(entry)
        proc = run_job(["bash", "-e", "-o", "pipefail", "-c", example.parsed], timeout=120, env=job_env(),
                       cwd=Path(tmp))
        if proc.returncode != 0:
            raise AssertionError(f"the bash block at {example.path}:{example.line} exited {proc.returncode}:\n"
                                 f"{proc.stdout[-4000:]}")


class BashParser(CodeBlockParser):
    """```bash blocks, run as they are; those that need a cluster or a fresh machine carry a not-run marker."""

    def __init__(self) -> None:
        super().__init__(language="bash", evaluator=run_bash)


class DiffParser(CodeBlockParser):
    """```diff blocks, each run as the two scripts it describes."""

    def __init__(self) -> None:
        super().__init__(language="diff", evaluator=run_diff)


WHERE_RUN = re.compile(r"(tests/[\w/]+\.py|\.ci/run|Makefile)")


def check_not_run(example: Example, reason: str) -> None:
    """A block marked ``not-run``: it must still parse, and the marker must name an existing file that runs it.

    bash blocks go through ``bash -n``, python blocks through ``compile``, diffs through both sides' compile.
    """
    from tests.conftest import ROOT

    where = WHERE_RUN.findall(reason)
    missing = [w for w in where if not (ROOT / w).exists()]
    if not where or missing:
        found = f"missing: {missing}" if missing else "none named"
        raise AssertionError(f"the not-run marker before {example.path}:{example.line} must name the test, Makefile "
                             f"or .ci/run that runs the block instead ({found}): {reason!r}")
    source = str(example.parsed)
    evaluator = example.region.evaluator
    if evaluator is run_bash:
        proc = subprocess.run(["bash", "-n", "-c", source], capture_output=True, text=True)
        if proc.returncode != 0:
            raise AssertionError(f"the bash block at {example.path}:{example.line} does not parse: {proc.stderr}")
    elif evaluator is run_diff:
        for script in split_diff(source):
            compile(script, f"{example.path}:{example.line}", "exec")
    else:
        compile(textwrap.dedent(source), f"{example.path}:{example.line}", "exec")


class NotRun(Skipper):
    """``<!-- not-run: next "why; tests/... runs it" -->``: the next block is checked (see :func:`check_not_run`)
    instead of run. Nothing is skipped: the item passes or fails like any other."""

    def __init__(self) -> None:
        super().__init__("not-run")
        self.reasons: dict = {}

    def install(self, example: Example, state, reason) -> None:
        example.document.push_evaluator(self)
        self.reasons[example.document] = eval(reason, {}) if reason else ""     # a quoted string

    def evaluate_other_example(self, example: Example) -> None:
        state = self.state_for(example)
        reason = self.reasons.get(example.document, "")
        if state.remove:
            self.remove(example)
        check_not_run(example, reason)


class NotRunParser(AbstractSkipParser):
    directive = "not-run"

    def __init__(self) -> None:
        super().__init__([DirectiveInHTMLCommentLexer(self.directive)])
        self.skipper = NotRun()


def setup_page(namespace: dict) -> None:
    """Each page's Python blocks run in a fresh temporary directory, from prelude_docs.py."""
    namespace["__docs_cwd"] = os.getcwd()
    namespace["__docs_tmp"] = tempfile.TemporaryDirectory(prefix="docs-page-")
    os.chdir(namespace["__docs_tmp"].name)
    exec(compile((HERE / "prelude_docs.py").read_text(), str(HERE / "prelude_docs.py"), "exec"), namespace)


def teardown_page(namespace: dict) -> None:
    os.chdir(namespace["__docs_cwd"])
    namespace["__docs_tmp"].cleanup()
