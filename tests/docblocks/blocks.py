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


# What a not-run marker must name: each test (file::function) or CI step that runs the block's commands instead.
RUN_BY_TEST = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
RUN_BY_CI = re.compile(r"(\.ci/run|Makefile:[\w-]+)")
# Programs whose first argument names what runs (hvdkit launch, docker compose, make demo, pip install).
WITH_SUBCOMMAND = {"hvdkit", "docker", "make", "pip"}


def block_commands(source: str) -> list[list[str]]:
    """Each command of a bash block as the words that say what runs: the program (its file name, after any
    VAR=value) and, for hvdkit, docker, make and pip, the first word after it; for ``python -m venv``, the module."""
    text = re.sub(r"\\\n", " ", source)
    commands = []
    for line in text.splitlines():
        words = [w for w in line.split("#", 1)[0].split() if not re.fullmatch(r"[A-Z_]+=\S*", w)]
        if not words:
            continue
        program = os.path.basename(words[0])
        key = [program]
        if program in WITH_SUBCOMMAND and len(words) > 1:
            key.append(words[1])
        elif program.startswith("python") and "-m" in words[:-1]:
            key = [words[words.index("-m") + 1]]         # the module runs: any interpreter will do
        commands.append(key)
    return commands


def test_source(module: str, name: str) -> str:
    """The named test function's own text, with the module's functions it calls (two calls deep): what runs
    when that test runs, rather than the whole module (where another test may run the command)."""
    import ast

    tree = ast.parse(module)
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    functions.update({f"{c.name}.{n.name}": n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body
                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))})
    start = functions.get(name) or next((n for k, n in functions.items() if k.endswith("." + name)), None)
    texts, todo, seen = [], [(start, 0)], set()
    while todo:
        node, depth = todo.pop()
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        text = ast.get_source_segment(module, node) or ""
        texts.append(text)
        if depth < 2:
            todo += [(functions[k], depth + 1) for k in functions
                     if "." not in k and re.search(rf"\b{re.escape(k)}\b", text)]
            # Fixtures it takes as arguments run too.
            todo += [(functions[a.arg], depth + 1) for a in node.args.args if a.arg in functions]
    return "\n".join(texts)


def named_sources(reason: str) -> tuple[list[str], str]:
    """The problems with a marker's names, and the text of what it names: each test function with the module's
    helpers and fixtures it uses, the conftest.py files above it and the examples and test workers it names; a
    Makefile target's recipe; .ci/run."""
    import ast

    from tests.conftest import ROOT

    problems, texts = [], []
    for path, name in RUN_BY_TEST.findall(reason):
        file = ROOT / path
        if not file.exists():
            problems.append(f"{path} does not exist")
            continue
        module = file.read_text()
        functions = (ast.FunctionDef, ast.AsyncFunctionDef)
        defined = {n.name for n in ast.walk(ast.parse(module)) if isinstance(n, functions)}
        if name not in defined:
            problems.append(f"{path} defines no {name}")
            continue
        text = test_source(module, name)
        texts.append(text)
        texts += [c.read_text() for c in file.parents[0:3] for c in [c / "conftest.py"] if c.exists()]
        for script in set(re.findall(r"([\w/]+\.py)", text)):      # the examples and test workers it runs
            texts += [d / script for d in (ROOT / "examples", ROOT / "tests" / "multiproc" / "workers")
                      if (d / script).is_file()]
        texts = [t.read_text() if isinstance(t, Path) else t for t in texts]
    for where in RUN_BY_CI.findall(reason):
        if where == ".ci/run":
            texts.append((ROOT / ".ci" / "run").read_text())
            continue
        target = where.split(":", 1)[1]
        recipe = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
        if recipe is None:
            problems.append(f"the Makefile has no target {target}")
        else:
            texts.append(recipe.group(1))
    return problems, "\n".join(texts)


def mentions(text: str, word: str) -> bool:
    """``word`` as a word of ``text``, where '_' separates words (run_hvdkit runs hvdkit; pipeline is not pip)."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(word)}(?![A-Za-z0-9])", text) is not None


def check_not_run(example: Example, reason: str) -> None:
    """A block marked ``not-run``: it must still parse, and its marker must name what runs its commands instead.

    The marker names tests as ``tests/path.py::test_name`` (each must exist), or ``.ci/run`` or a
    ``Makefile:target``; every command of a bash block (its program, and hvdkit's, docker's, make's and pip's
    subcommand) must appear in what they name, and every ``hk.`` call of a python block in the tests or the
    examples they run. bash blocks go through ``bash -n``, python blocks through ``compile``.
    """
    where = f"the not-run marker before {example.path}:{example.line}"
    problems, named = named_sources(reason)
    if not RUN_BY_TEST.search(reason) and not RUN_BY_CI.search(reason):
        problems.append("it names no tests/file.py::test_name, .ci/run or Makefile:target that runs the block")
    source = str(example.parsed)
    evaluator = example.region.evaluator
    if evaluator is run_bash:
        wanted = [" ".join(key) for key in block_commands(source)]
        missing = [key for key in wanted if not all(mentions(named, word) for word in key.split())]
    else:
        missing = sorted({f"hk.{name}" for name in re.findall(r"\bhk\.(\w+)", source) if not mentions(named, name)})
    if missing:
        problems.append(f"nothing it names runs {', '.join(missing)}")
    if problems:
        raise AssertionError(f"{where}: {'; '.join(problems)}: {reason!r}")
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
    namespace["__docs_env"] = dict(os.environ)      # hk.init() sets Horovod's tuning defaults in this process
    namespace["__docs_tmp"] = tempfile.TemporaryDirectory(prefix="docs-page-")
    os.chdir(namespace["__docs_tmp"].name)
    exec(compile((HERE / "prelude_docs.py").read_text(), str(HERE / "prelude_docs.py"), "exec"), namespace)


def teardown_page(namespace: dict) -> None:
    os.chdir(namespace["__docs_cwd"])
    # The jobs of tests run after a page (job_env copies os.environ) must not inherit them: under Gloo, elastic,
    # the MPI defaults HOROVOD_FUSION_THRESHOLD=1 MiB with HOROVOD_CYCLE_TIME=0.1 crash a survivor's re-init.
    os.environ.clear()
    os.environ.update(namespace["__docs_env"])
    namespace["__docs_tmp"].cleanup()
