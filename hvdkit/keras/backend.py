"""Deprecated: the Keras mode's module is :mod:`hvdkit.keras.mode` (docs/API.md, *Renamed names*)."""

import warnings

from hvdkit.keras.mode import BackendError, resolve_backend, use_backend

warnings.warn("hvdkit: hvdkit.keras.backend is deprecated and will be removed: import hvdkit.keras.mode "
              "(or use hk.use_backend, hk.resolve_backend)", FutureWarning, stacklevel=2)

__all__ = ["BackendError", "resolve_backend", "use_backend"]
