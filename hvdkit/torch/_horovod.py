"""The one place hvdkit.torch imports Horovod, with the install hint on failure."""

from __future__ import annotations

try:
    import horovod.torch as hvd  # noqa: F401  (re-exported)
except ImportError as exc:  # never swallow: say how to get a working build
    raise ImportError(
        f"hvdkit.torch needs Horovod built with PyTorch support ({exc}): "
        "run scripts/install.sh (or `make install`), which builds Horovod 0.28.1 against this torch"
    ) from exc
