"""Write docs/REFERENCE.md: every name in hvdkit.torch's and hvdkit.keras's ``__all__``, with its signature
and the first paragraph of its docstring, read from the code.

    python scripts/api_reference.py            # rewrite docs/REFERENCE.md
    python scripts/api_reference.py --check    # exit 1 when the file is not what the code gives

tests/adapters/test_api_reference.py runs ``--check``; docs/API.md says which names the adapters share.
Needs torch, TensorFlow, Keras and Horovod (``make install``): the names resolve to the frameworks' objects.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "REFERENCE.md"
HEADER = """# Reference: every public name

Generated from the code by `scripts/api_reference.py` (`make reference`);
`tests/adapters/test_api_reference.py` fails when this file and the code
disagree. Each entry gives the signature and the docstring (the first
paragraph for what another library defines); the guide is docs/ADAPTERS.md, and docs/API.md says which names
the two adapters share and why one side lacks a name.
"""


def docstring(obj) -> str:
    """The whole docstring; its own hvdkit docstrings are written for users (examples indented, as Markdown
    shows code). An object from another library gets its first paragraph only."""
    doc = inspect.getdoc(obj) or ""
    where = getattr(obj, "__module__", "") or ""
    if inspect.ismodule(obj) or not where.startswith("hvdkit"):
        return " ".join(doc.split("\n\n")[0].split())
    return doc


def signature(name: str, obj) -> str:
    if inspect.ismodule(obj):
        return f"{name} (module {obj.__name__})"
    if inspect.isclass(obj) or callable(obj):
        try:       # a default's repr without its address (<function cross_entropy>): the same on every run
            return re.sub(r" at 0x[0-9a-f]+>", ">", f"{name}{inspect.signature(obj)}")
        except (TypeError, ValueError):
            return f"{name}(...)"
    return f"{name} = {obj!r}"


def entries(adapter: str) -> list[str]:
    module = importlib.import_module(f"hvdkit.{adapter}")
    lines = [f"## `hvdkit.{adapter}`", ""]
    for name in sorted(module.__all__, key=str.lower):
        obj = getattr(module, name)
        where = getattr(obj, "__module__", None) if not inspect.ismodule(obj) else None
        lines.append(f"### `{adapter}.{name}`")
        lines.append("")
        lines.append("```")
        lines.append(signature(name, obj))
        lines.append("```")
        lines.append("")
        text = docstring(obj)
        if where and not where.startswith("hvdkit"):
            text = f"Re-exported from `{where}`. {text}".strip()
        if text:
            lines.append(text)
            lines.append("")
    return lines


def render() -> str:
    return "\n".join([HEADER, *entries("torch"), *entries("keras")]).rstrip() + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 when they differ")
    args = p.parse_args()
    os.environ["KERAS_BACKEND"] = "tensorflow"      # the signatures are the same on every backend
    os.environ.pop("TF_USE_LEGACY_KERAS", None)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is not what the code gives: run python scripts/api_reference.py",
                  file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
