"""Docs are code: the Markdown blocks of README.md and docs/ that pytest runs through Sybil (the root conftest.py).

- ```` ```python ```` blocks run in this process, one namespace per page, in the ``adapters`` tier:
  hvdkit.torch at world size 1, started from ``prelude_docs.py`` (a model, data, an optimizer).
- ```` ```diff ```` blocks (the README's) are two scripts: the ' ' and '-' lines are the single-process
  original, run as one process; the ' ' and '+' lines are the hvdkit script, run under
  ``horovodrun -np 2 --gloo``. Both start from ``prelude_torch.py`` or ``prelude_keras.py`` (imports,
  the digits data, the model), in the ``multiproc`` tier.
- ```` ```bash ```` blocks run with ``bash -e -o pipefail`` in a temporary directory linked to the
  repository's top-level entries, in the ``cli`` tier.
- A block that cannot run here (a cluster, Docker, a fresh machine) is marked in the Markdown
  ``<!-- not-run: next "why; tests/path.py::test_name runs it" -->`` (or ``.ci/run``, ``Makefile:target``):
  it is checked instead, never skipped: it must parse (``bash -n`` or ``compile``), each named test must
  exist, and what the marker names must run every command of the block (``blocks.check_not_run``).
"""
